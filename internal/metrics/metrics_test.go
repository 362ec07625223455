package metrics_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/metrics"
)

// TestValuesAreAnEMFArray: a metric with Values is written as an array, one
// sample per value (what CloudWatch's percentiles need); more than EMF's
// 100 per line is refused.
func TestValuesAreAnEMFArray(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	em := metrics.New(&buf, "Test", map[string]string{"Service": "worker"})
	require.NoError(t, em.Emit(nil,
		metrics.Metric{Name: "ReceiptToEffectSeconds", Values: []float64{0.1, 0.25, 3}, Unit: metrics.Seconds},
		metrics.Metric{Name: "Processed", Value: 3, Unit: metrics.Count}))
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
	require.Equal(t, []any{0.1, 0.25, 3.0}, line["ReceiptToEffectSeconds"])
	require.Equal(t, 3.0, line["Processed"])

	buf.Reset()
	err := em.Emit(nil, metrics.Metric{Name: "ReceiptToEffectSeconds", Values: make([]float64, metrics.MaxValues+1), Unit: metrics.Seconds})
	require.ErrorContains(t, err, "ReceiptToEffectSeconds has 101 values, at most 100 per line")
	require.Zero(t, buf.Len(), "nothing written")
}

// TestPublishListsOnlyTheNamedMetricsWithTheBaseDimensions: the values all
// stay in the log line; only the named metrics, emitted without extra
// dimensions, are declared as CloudWatch metrics (and so billed).
func TestPublishListsOnlyTheNamedMetricsWithTheBaseDimensions(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	em := metrics.New(&buf, "Test", map[string]string{"Service": "webhook"}).Publish([]string{"Rejected"})
	declared := func() ([]string, map[string]any) {
		var line map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
		buf.Reset()
		aws, ok := line["_aws"].(map[string]any)
		if !ok {
			return nil, line
		}
		var names []string
		for _, d := range aws["CloudWatchMetrics"].([]any)[0].(map[string]any)["Metrics"].([]any) {
			names = append(names, d.(map[string]any)["Name"].(string))
		}
		return names, line
	}

	require.NoError(t, em.Emit(nil, metrics.Metric{Name: "Rejected", Value: 1, Unit: metrics.Count}, metrics.Metric{Name: "Received", Value: 2, Unit: metrics.Count}))
	names, line := declared()
	require.Equal(t, []string{"Rejected"}, names)
	require.Equal(t, 2.0, line["Received"], "an unpublished value stays in the log")

	require.NoError(t, em.Emit(map[string]string{"Reason": "bad_signature"}, metrics.Metric{Name: "Rejected", Value: 1, Unit: metrics.Count}))
	names, line = declared()
	require.Nil(t, names, "a breakdown by reason is a log line only")
	require.Equal(t, "bad_signature", line["Reason"])
	require.Equal(t, 1.0, line["Rejected"])

	all := metrics.New(&buf, "Test", map[string]string{"Service": "webhook"})
	require.NoError(t, all.Emit(map[string]string{"Reason": "x"}, metrics.Metric{Name: "Received", Value: 1, Unit: metrics.Count}))
	names, _ = declared()
	require.Equal(t, []string{"Received"}, names, "without Publish everything is published")
}
