package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

func cold(out io.Writer) {
	fmt.Fprintln(out, "## 5. Cold start (host-architecture binaries under aws-lambda-rie, from the e2e suite)")
	fmt.Fprintln(out)
	if *coldStart == "" {
		fmt.Fprintln(out, "No cold-start report given.")
		return
	}
	b, err := os.ReadFile(*coldStart)
	if err != nil {
		fmt.Fprintf(out, "No cold-start report (%v).\n", err)
		return
	}
	var t table
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Function    string    `json:"function"`
			BinaryBytes int64     `json:"binary_bytes"`
			InitMs      []float64 `json:"init_ms"`
			Min         float64   `json:"init_ms_min"`
			P50         float64   `json:"init_ms_p50"`
			Max         float64   `json:"init_ms_max"`
		}
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		t.add(r.Function, fmt.Sprintf("%.1f", float64(r.BinaryBytes)/(1<<20)), strconv.Itoa(len(r.InitMs)),
			fmt.Sprintf("%.1f", r.Min), fmt.Sprintf("%.1f", r.P50), fmt.Sprintf("%.1f", r.Max))
	}
	t.print(out, "function", "binary MiB", "cold starts", "INIT min ms", "INIT p50 ms", "INIT max ms")
}
