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
