package worker_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// attachRelay attaches an outbox relay publishing to a stand-in.
func (b *testBundle) attachRelay(t *testing.T, w *worker.Worker, every time.Duration) *eventbridgetest.Server {
	t.Helper()
	eb := eventbridgetest.New(t, "bus")
	r, err := outbox.New(b.pool, eb.Client(func(o *eventbridge.Options) { o.RetryMaxAttempts = 1 }), outbox.Config{Bus: "bus"},
		slog.New(slog.DiscardHandler), metrics.New(b.metrics, "Test", map[string]string{"Service": "worker"}))
	require.NoError(t, err)
	w.SetRelay(r, every)
	return eb
}

// A scheduled-only run publishes the outbox rows its receipts wrote before
// it returns, and reports the outbox's backlog.
func TestScheduledRunRelaysTheOutboxAtItsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.receive(t, paid("evt_r1", "in_r1"))
	b.receive(t, paid("evt_r2", "in_r2"))
	w := b.newWorker(t, nil, worker.Config{})
	eb := b.attachRelay(t, w, time.Hour)

	s := b.run(t, w)
	require.Equal(t, 2, s.Processed)
	require.Equal(t, 2, s.OutboxPublished)
	require.Equal(t, 0, b.db.Count(t, "outbox", "published_at IS NULL"))
	events := eb.Events()
	require.Len(t, events, 2)
	var d struct {
		OutboxID int64          `json:"outbox_id"`
		Data     map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(events[0].Detail, &d))
	require.NotZero(t, d.OutboxID)
	require.Equal(t, "InvoicePaymentBooked", events[0].DetailType)
	require.Contains(t, []any{"in_r1", "in_r2"}, d.Data["invoice_id"])
	require.Contains(t, b.metrics.String(), `"OutboxBacklogCount":0`)
	require.Contains(t, b.metrics.String(), `"OutboxPublished":2`)
}

// A resident run publishes a receipt's outbox row right after the round
// that wrote it (the round kicks the relay; the idle interval here is an
// hour, so nothing else could).
func TestResidentRunRelaysAfterEachRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, watch := b.residentWorker(t, b.pool, worker.Config{Concurrency: 2, PollInterval: 10 * time.Millisecond})
	eb := b.attachRelay(t, w, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	wait := runAsync(ctx, w)

	waitFor(t, "the worker idles", func() bool { return watch.idle.Load() > 0 })
	storeEvent(t, b.pool, paid("evt_res", "in_res"), false)
	b.db.WaitUntil(t, "the outbox row is published", "SELECT count(*) = 1 FROM outbox WHERE aggregate_id = 'in_res' AND published_at IS NOT NULL")
	require.Len(t, eb.Events(), 1)
	cancel()
	s, err := wait()
	require.NoError(t, err)
	require.Equal(t, 1, s.Processed)
	require.Equal(t, 1, s.OutboxPublished)
}
