// Package metrics writes CloudWatch metrics in the Embedded Metric Format:
// one JSON line on stdout per batch, which CloudWatch Logs turns into metrics
// without an API call (and without the latency or IAM grant one would need).
package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"
)

// Units used by this project.
const (
	Count        = "Count"
	Seconds      = "Seconds"
	Milliseconds = "Milliseconds"
)

// Metric is one value, or several: Values (when not empty) are written as
// an EMF array, each element one sample (so CloudWatch percentiles such as
// p50 and p99 see every one). EMF takes at most MaxValues per metric.
type Metric struct {
	Name   string
	Value  float64
	Values []float64
	Unit   string
}

// MaxValues is how many values one metric of one EMF line may carry.
const MaxValues = 100

// Emitter writes EMF lines to W.
type Emitter struct {
	w          io.Writer
	namespace  string
	dimensions map[string]string
	now        func() time.Time
	mu         sync.Mutex
	// publish, when not nil, names the metrics published as CloudWatch
	// metrics (Publish).
	publish map[string]bool
}

// Publish makes only the named metrics CloudWatch metrics, and only when
// emitted with the emitter's own dimensions (a breakdown by an extra
// dimension, such as Rejected by Reason, is not published). Every value
// still goes to the log line, with its extra dimensions as fields, for
// CloudWatch Logs Insights: EMF bills a metric only for the members its
// CloudWatchMetrics directive lists, and each name and dimension
// combination is a custom metric at $0.30 a month
// (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).
// The stack lists exactly the metrics its alarms and dashboard read
// (METRICS_PUBLISH). Without a call, everything is published.
func (e *Emitter) Publish(names []string) *Emitter {
	e.publish = map[string]bool{}
	for _, n := range names {
		e.publish[n] = true
	}
	return e
}

// New returns an Emitter. dimensions are added to every line (for example
// Service=worker, Stage=prod); namespace must be non-empty.
func New(w io.Writer, namespace string, dimensions map[string]string) *Emitter {
	return &Emitter{w: w, namespace: namespace, dimensions: maps.Clone(dimensions), now: time.Now}
}

// Emit writes ms as one EMF line with the emitter's dimensions plus extra.
func (e *Emitter) Emit(extra map[string]string, ms ...Metric) error {
	if e == nil || len(ms) == 0 {
		return nil
	}
	dims := maps.Clone(e.dimensions)
	if dims == nil {
		dims = map[string]string{}
	}
	maps.Copy(dims, extra)
	keys := slices.Sorted(maps.Keys(dims))

	defs := make([]map[string]string, 0, len(ms))
	line := map[string]any{}
	for k, v := range dims {
		line[k] = v
	}
	for _, m := range ms {
		if e.publish == nil || (len(extra) == 0 && e.publish[m.Name]) {
			defs = append(defs, map[string]string{"Name": m.Name, "Unit": m.Unit})
		}
		switch {
		case len(m.Values) > MaxValues:
			return fmt.Errorf("encoding metrics: %s has %d values, at most %d per line", m.Name, len(m.Values), MaxValues)
		case len(m.Values) > 0:
			line[m.Name] = m.Values
		default:
			line[m.Name] = m.Value
		}
	}
	if len(defs) > 0 { // else a plain log line: nothing to publish
		line["_aws"] = map[string]any{
			"Timestamp": e.now().UnixMilli(),
			"CloudWatchMetrics": []any{map[string]any{
				"Namespace":  e.namespace,
				"Dimensions": [][]string{keys},
				"Metrics":    defs,
			}},
		}
	}
	b, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("encoding metrics: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err = e.w.Write(append(b, '\n'))
	return err
}
