package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func load(t *testing.T) (template, Prices) {
	t.Helper()
	var tpl template
	raw, err := os.ReadFile("testdata/small.template.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &tpl))
	var p Prices
	raw, err = os.ReadFile("prices.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &p))
	return tpl, p
}

func item(t *testing.T, b Bill, prefix string) float64 {
	t.Helper()
	for _, it := range b.Items {
		if strings.HasPrefix(it.Name, prefix) {
			return round(it.USD)
		}
	}
	t.Fatalf("no item %q in %v", prefix, b.Items)
	return 0
}

// TestPricesATemplate: each line from the template and the price table,
// figures worked out by hand from prices.json.
func TestPricesATemplate(t *testing.T) {
	t.Parallel()
	tpl, p := load(t)
	b, err := Compute("dev", tpl, p)
	require.NoError(t, err)
	require.Equal(t, 11.68, item(t, b, "RDS db.t4g.micro"))                                        // 0.016 × 730
	require.Equal(t, 2.30, item(t, b, "RDS storage 20 GiB gp3"))                                   // 20 × 0.115
	require.Equal(t, 21.90, item(t, b, "RDS Proxy"))                                               // 2 vCPU × 0.015 × 730
	require.Equal(t, 0.80, item(t, b, "Secrets Manager"))                                          // 2 × 0.40
	require.Equal(t, 0.20, item(t, b, "CloudWatch alarms"))                                        // 2 alarm metrics
	require.Equal(t, 0.60, item(t, b, "CloudWatch custom metrics"))                                // 2 distinct (the alarm's is the dashboard's)
	require.Equal(t, 3.00, item(t, b, "CloudWatch dashboard"))                                     //
	require.Equal(t, round(53800*(0.3*0.25*0.0000133334+0.0000002)), item(t, b, "Lambda worker ")) // not resident
	require.Equal(t, b.Total(), func() float64 {
		s := 0.0
		for _, it := range b.Items {
			s += round(it.USD)
		}
		return round(s)
	}())

	// Multi-AZ doubles the instance and its storage; a resident worker is
	// priced as one.
	tpl.Resources["Database"].Properties["MultiAZ"] = true
	tpl.Resources["WorkerFunctionACE6A4B0"].Properties["Environment"] = map[string]any{"Variables": map[string]any{"POLL_INTERVAL": "250ms"}}
	b, err = Compute("prod", tpl, p)
	require.NoError(t, err)
	require.Equal(t, 23.36, item(t, b, "RDS db.t4g.micro"))
	require.Equal(t, 4.60, item(t, b, "RDS storage"))
	require.Equal(t, 10.23, item(t, b, "Lambda worker_resident")) // 43,800 × 70 s × 0.25 GB × 0.0000133334 + requests

	// A function that lists what it publishes is billed for exactly that.
	tpl.Resources["WorkerFunctionACE6A4B0"].Properties["Environment"] = map[string]any{"Variables": map[string]any{
		"POLL_INTERVAL": "0s", "METRICS_PUBLISH": "OldestUnprocessedAgeSeconds,ReceiptToEffectSeconds,NeedsReviewCount",
	}}
	b, err = Compute("prod", tpl, p)
	require.NoError(t, err)
	require.Equal(t, 0.90, item(t, b, "CloudWatch custom metrics"))
}

// TestAnUnpricedTypeFails: a resource type neither priced nor listed as
// free with a reason fails the run, naming it.
func TestAnUnpricedTypeFails(t *testing.T) {
	t.Parallel()
	tpl, p := load(t)
	tpl.Resources["Cache"] = resource{Type: "AWS::ElastiCache::CacheCluster"}
	_, err := Compute("dev", tpl, p)
	require.ErrorContains(t, err, "AWS::ElastiCache::CacheCluster (Cache): no price in scripts/cost and not listed as free with a reason")

	tpl, p = load(t)
	delete(p.Free, "AWS::Logs::LogGroup")
	_, err = Compute("dev", tpl, p)
	require.ErrorContains(t, err, "AWS::Logs::LogGroup")

	tpl, p = load(t)
	pr := p.Prices["secret_month"]
	pr.Source = ""
	p.Prices["secret_month"] = pr
	_, err = Compute("dev", tpl, p)
	require.ErrorContains(t, err, `price "secret_month" missing, or without source and date`)
}

// TestEveryPriceHasASourceAndADate: the table a reviewer reads.
func TestEveryPriceHasASourceAndADate(t *testing.T) {
	t.Parallel()
	_, p := load(t)
	for name, pr := range p.Prices {
		require.True(t, strings.HasPrefix(pr.Source, "https://"), name)
		require.NotEmpty(t, pr.Date, name)
		require.NotEmpty(t, pr.Unit, name)
	}
	for ty, why := range p.Free {
		require.NotEmpty(t, strings.TrimSpace(why), ty)
	}
}

// TestCheckFailsWhenTheTableDiffers: -check compares the document's table
// with the computed one; -write fills it.
func TestCheckFailsWhenTheTableDiffers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	doc := dir + "/deployment.md"
	require.NoError(t, os.WriteFile(doc, []byte("# Cost\n\n"+beginMarker+"| stale |\n"+endMarker+"after\n"), 0o644))
	args := []string{"-template", "dev=testdata/small.template.json", "-prices", "prices.json"}
	var out bytes.Buffer
	err := run(append(args, "-check", doc), &out)
	require.ErrorContains(t, err, "the cost table differs")
	require.NoError(t, run(append(args, "-write", doc), &out))
	require.NoError(t, run(append(args, "-check", doc), &out))
	written, err := os.ReadFile(doc)
	require.NoError(t, err)
	require.Contains(t, string(written), "| **Total** | **$")
	require.True(t, strings.HasSuffix(string(written), endMarker+"after\n"))

	require.NoError(t, os.WriteFile(doc, []byte("no markers\n"), 0o644))
	require.ErrorContains(t, run(append(args, "-check", doc), &out), "markers are missing")
}
