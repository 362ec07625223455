//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Init is one INIT phase as the emulator logs it:
//
//	INIT START(type: on-demand, phase: init)
//	INIT RTDONE(status: success)
//	INIT REPORT(durationMs: 38.739000)
//
// The duration runs from the emulator starting the bootstrap process until
// the runtime asked for its first event (or failed): main() up to
// lambda.Start, the number a Lambda cold start reports as Init Duration.
// (The "Init Duration" on the emulator's REPORT line measures only the
// emulator's own hand-off, well under a millisecond, and is not used.)
type Init struct {
	Phase    string        // "init" (cold start), or "invoke" (re-init after a failed init)
	Status   string        // "success", "error", "timeout"; "" when not reported
	Duration time.Duration //
}

var (
	initStart  = regexp.MustCompile(`INIT START\(type: [^,]*, phase: ([a-z]+)\)`)
	initDone   = regexp.MustCompile(`INIT RTDONE\(status: ([a-z_]+)\)`)
	initReport = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)
)

// ParseInits reads the INIT phases from an emulator's log.
func ParseInits(log string) []Init {
	var inits []Init
	var cur *Init
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := initStart.FindStringSubmatch(line); m != nil {
			cur = &Init{Phase: m[1]}
			continue
		}
		if cur == nil {
			continue
		}
		if m := initDone.FindStringSubmatch(line); m != nil {
			cur.Status = m[1]
		} else if m := initReport.FindStringSubmatch(line); m != nil {
			ms, err := strconv.ParseFloat(m[1], 64)
			if err == nil {
				cur.Duration = time.Duration(ms * float64(time.Millisecond))
			}
			inits = append(inits, *cur)
			cur = nil
		}
	}
	return inits
}

// FunctionReport is what the e2e run observed for one function.
type FunctionReport struct {
	Function    string `json:"function"`
	BinaryBytes int64  `json:"binary_bytes"`
	// InitMs lists the successful cold starts' INIT durations, in the order
	// the emulators stopped.
	InitMs []float64 `json:"init_ms"`
	// FailedInits counts the INIT phases that failed (the init-failure
	// scenarios cause them on purpose).
	FailedInits int     `json:"failed_inits"`
	InitMsMin   float64 `json:"init_ms_min"`
	InitMsP50   float64 `json:"init_ms_p50"`
	InitMsMax   float64 `json:"init_ms_max"`
}

// String is the one-line summary the tests log.
func (r FunctionReport) String() string {
	s := fmt.Sprintf("%-8s binary %6.2f MiB (%d bytes)", r.Function, float64(r.BinaryBytes)/(1<<20), r.BinaryBytes)
	if len(r.InitMs) == 0 {
		return s + fmt.Sprintf("  no successful cold start observed (failed inits: %d)", r.FailedInits)
	}
	return s + fmt.Sprintf("  cold starts %d: INIT min %.1f ms, p50 %.1f ms, max %.1f ms (failed inits: %d)",
		len(r.InitMs), r.InitMsMin, r.InitMsP50, r.InitMsMax, r.FailedInits)
}

// Recorder gathers the binaries' sizes and the emulators' INIT phases of a
// test run. It is safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	sizes map[string]int64
	inits map[string][]Init
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{sizes: map[string]int64{}, inits: map[string][]Init{}}
}

// Binary records a function's binary size.
func (r *Recorder) Binary(b Binary) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sizes[b.Name] = b.Size
}

// Inits records the INIT phases one emulator of function reported.
func (r *Recorder) Inits(function string, inits []Init) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inits[function] = append(r.inits[function], inits...)
}

// Reports summarises per function, sorted by name.
func (r *Recorder) Reports() []FunctionReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := map[string]bool{}
	for n := range r.sizes {
		names[n] = true
	}
	for n := range r.inits {
		names[n] = true
	}
	var out []FunctionReport
	for _, n := range slices.Sorted(maps.Keys(names)) {
		rep := FunctionReport{Function: n, BinaryBytes: r.sizes[n], InitMs: []float64{}}
		for _, in := range r.inits[n] {
			switch {
			case in.Phase == "init" && in.Status == "success":
				rep.InitMs = append(rep.InitMs, float64(in.Duration.Microseconds())/1000)
			case in.Status != "" && in.Status != "success":
				rep.FailedInits++
			}
		}
		if len(rep.InitMs) > 0 {
			sorted := slices.Sorted(slices.Values(rep.InitMs))
			rep.InitMsMin, rep.InitMsMax = sorted[0], sorted[len(sorted)-1]
			rep.InitMsP50 = sorted[(len(sorted)-1)/2]
		}
		out = append(out, rep)
	}
	return out
}

// WriteReports writes one JSON object per line, the format benchmark
// scripts read from E2E_REPORT.
func WriteReports(w io.Writer, reports []FunctionReport) error {
	enc := json.NewEncoder(w)
	for _, r := range reports {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
