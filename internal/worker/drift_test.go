package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// TestReceiptsOfAnotherAPIVersionAreCounted: a delivery whose API version is
// not the one the stage declares is processed as usual and counted once
// (UnexpectedApiVersion by endpoint and version, and the run's total for the
// alarm), only when it is first claimed. An event the reconciler listed is
// not counted: it carries the version the account had when it was created,
// not the endpoint's.
func TestReceiptsOfAnotherAPIVersionAreCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_ok", "in_1"))
	b.receive(t, withVersion(t, paid("evt_new_1", "in_2"), "2025-08-27.basil"))
	b.receive(t, withVersion(t, stripetest.Event("evt_new_2", "customer.updated", map[string]any{"id": "cus_1"}), "2025-08-27.basil"))
	listed, err := stripeevent.Parse(withVersion(t, paid("evt_listed", "in_9"), "2026-03-25.dahlia"))
	require.NoError(t, err)
	_, err = inbox.StoreFrom(context.Background(), b.pool, inbox.SourceReconcile, "billing", listed)
	require.NoError(t, err)
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1, APIVersion: stripetest.APIVersion})
	s := b.run(t, w)
	require.Equal(t, 2, s.UnexpectedAPIVersion)
	require.Equal(t, 3, s.Processed, "counted, and processed as usual")
	var detail, total int
	for _, line := range strings.Split(strings.TrimSpace(b.metrics.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		if _, ok := m["UnexpectedApiVersion"]; !ok {
			continue
		}
		if m["Endpoint"] == "billing" && m["ApiVersion"] == "2025-08-27.basil" {
			detail += int(m["UnexpectedApiVersion"].(float64))
		} else if _, dims := m["Endpoint"]; !dims {
			total += int(m["UnexpectedApiVersion"].(float64))
		}
	}
	require.Equal(t, 2, detail)
	require.Equal(t, 2, total)

	// Nothing new: the next run counts nothing (and says so, for the alarm).
	b.metrics.Reset()
	require.Zero(t, b.run(t, w).UnexpectedAPIVersion)
	require.Contains(t, b.metrics.String(), `"UnexpectedApiVersion":0`)

	// Without a declared version nothing is counted or emitted.
	b2 := setup(t)
	b2.receive(t, withVersion(t, paid("evt_new", "in_3"), "2025-08-27.basil"))
	require.Zero(t, b2.run(t, b2.newWorker(t, nil, worker.Config{Concurrency: 1})).UnexpectedAPIVersion)
	require.NotContains(t, b2.metrics.String(), "UnexpectedApiVersion")
}

func TestAPIVersionIsValidated(t *testing.T) {
	t.Parallel()
	cfg := worker.Config{Mode: worker.ModeTest, APIVersion: "latest"}.WithDefaults()
	require.ErrorContains(t, cfg.Validate(), `STRIPE_API_VERSION: "latest" is not a Stripe API version`)
	cfg.APIVersion = "2025-08-27.basil"
	require.NoError(t, cfg.Validate())
}
