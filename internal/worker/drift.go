package worker

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
)

// countDrift counts the claimed deliveries whose API version is one the
// stage did not declare (Config.APIVersion, when set) or of a release the
// code has not named (handlers.ClassifyVersion: booked when its fields
// satisfy the handlers' contracts, so a human must still read its
// changelog): an endpoint upgraded in the Stripe dashboard, or a new
// account's default, starts sending a new payload shape at once, and the
// alarm on UnexpectedApiVersion says so within minutes. Only the endpoint's
// own deliveries count (source webhook): an event the reconciler listed
// carries the version the account had when it was created, whatever the
// endpoint's. Only a first claim counts (attempts 1; a retry or a re-claim
// after a lease is the same receipt). Each endpoint and version gets a line
// of its own (dimensions Endpoint and ApiVersion, to see which); the run's
// total is emitted with the run's metrics (Worker.emit), for the alarm.
// Returns the count.
func (w *Worker) countDrift(ctx context.Context, claimed []inbox.Claimed) int {
	type key struct{ endpoint, version string }
	counts := map[key]int{}
	for _, c := range claimed {
		if c.Attempts != 1 || c.Source != inbox.SourceWebhook {
			continue
		}
		undeclared := w.cfg.APIVersion != "" && c.APIVersion != w.cfg.APIVersion
		if undeclared || handlers.ClassifyVersion(c.APIVersion) == handlers.VersionUnnamed {
			counts[key{c.Endpoint, c.APIVersion}]++
		}
	}
	total := 0
	for _, k := range slices.SortedFunc(maps.Keys(counts), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.endpoint, b.endpoint), cmp.Compare(a.version, b.version))
	}) {
		n := counts[k]
		total += n
		version := k.version
		if version == "" {
			version = "none"
		}
		w.logger.WarnContext(ctx, "receipts of an unexpected Stripe API version", "endpoint", k.endpoint, "api_version", version,
			"expected", w.cfg.APIVersion, "named_release", handlers.ClassifyVersion(k.version) != handlers.VersionUnnamed, "count", n)
		if err := w.metrics.Emit(map[string]string{"Endpoint": k.endpoint, "ApiVersion": version},
			metrics.Metric{Name: "UnexpectedApiVersion", Value: float64(n), Unit: metrics.Count}); err != nil {
			w.logger.ErrorContext(ctx, "writing metrics", "error", err)
		}
	}
	return total
}
