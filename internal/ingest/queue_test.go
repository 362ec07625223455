package ingest_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/sqstest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/wake"
)

func drainer(t *testing.T, h *ingest.Handler) (*ingest.Drainer, *sqstest.Server) {
	t.Helper()
	q := sqstest.New()
	t.Cleanup(q.Close)
	q.CreateQueue("ingest-dlq", "", 0)
	return &ingest.Drainer{
		Handler: h, SQS: q.Client(),
		QueueURL: q.CreateQueue("ingest", "ingest-dlq", 3), DeadLetterURL: q.QueueURL("ingest-dlq"),
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	}, q
}

// TestDrain: what is on the queue is stored and deleted after the commit;
// a refusal goes to the dead-letter queue with its reason, at once; the
// invocation's own payload is never read.
func TestDrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d, q := drainer(t, b.ingest)
	d.Metrics = metrics.New(b.metrics, "Test", nil)
	ev := paid("evt_q1", "in_q1")
	q.Send("ingest", string(stripetest.EventBridge("eb-1", stripetest.EventBridgeSource, ev)))
	q.Send("ingest", string(stripetest.EventBridge("eb-2", stripetest.EventBridgeSource, ev)))
	q.Send("ingest", string(stripetest.EventBridge("eb-3", "aws.partner/stripe.com/ed_unknown", ev)))
	q.Send("ingest", string(stripetest.EventBridge("eb-4", stripetest.EventBridgeSource, []byte(`{"object":"customer","id":"cus_1"}`))))

	// An invocation handing it an event directly: ignored.
	injected := stripetest.EventBridge("eb-x", stripetest.EventBridgeSource, paid("evt_injected", "in_injected"))
	s, err := d.Drain(context.Background(), injected)
	require.NoError(t, err)
	require.Equal(t, ingest.Summary{Stored: 1, Duplicate: 1, DeadLettered: 2}, s)
	require.Empty(t, q.Messages("ingest"))
	dead := q.Messages("ingest-dlq")
	require.Len(t, dead, 2)
	require.Equal(t, ingest.ReasonUnknownSource, dead[0].Attributes["Reason"])
	require.Contains(t, dead[0].Attributes["Error"], "ed_unknown")
	require.Equal(t, ingest.ReasonNotStripe, dead[1].Attributes["Reason"])
	require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "event_id = 'evt_injected'"))
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = 'evt_q1' AND source = 'eventbridge'"))
	require.Contains(t, b.metrics.String(), `"IngestDeadLettered"`)
	b.requireOneBooking(t, "evt_q1", "in_q1")
}

// TestDrainTransient: a message whose store fails stays on the queue and
// comes back; after maxReceiveCount the redrive policy moves it to the
// dead-letter queue. A commit whose delete fails comes back a duplicate.
func TestDrainTransient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := pool(t, b.db, 1)
	broken, err := ingest.New(p, ingest.Sources{Default: "billing"}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	p.Close()
	d, q := drainer(t, broken)
	q.Send("ingest", string(stripetest.EventBridge("eb-1", stripetest.EventBridgeSource, paid("evt_t1", "in_t1"))))
	for i := 1; i <= 3; i++ {
		s, err := d.Drain(context.Background(), nil)
		require.ErrorIs(t, err, ingest.ErrLeftOnQueue)
		require.Equal(t, ingest.Summary{Failed: 1}, s)
		require.Len(t, q.Messages("ingest"), 1)
		require.Equal(t, i, q.Messages("ingest")[0].Receives)
		q.Expire()
	}
	s, err := d.Drain(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, ingest.Summary{}, s)
	require.Len(t, q.Messages("ingest-dlq"), 1, "redriven after maxReceiveCount")

	d, q = drainer(t, b.ingest)
	q.Send("ingest", string(stripetest.EventBridge("eb-2", stripetest.EventBridgeSource, paid("evt_t2", "in_t2"))))
	q.Fail("DeleteMessage", 1)
	s, err = d.Drain(context.Background(), nil)
	require.ErrorIs(t, err, ingest.ErrLeftOnQueue)
	require.Equal(t, ingest.Summary{Failed: 1}, s)
	q.Expire()
	s, err = d.Drain(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, ingest.Summary{Duplicate: 1}, s)
	require.Empty(t, q.Messages("ingest"))
	b.requireOneBooking(t, "evt_t2", "in_t2")
}

// TestADrainThatStoredWakesTheWorker: receipts that came through
// EventBridge start a worker run as the webhook's do (a worker that is not
// resident would otherwise wait for its schedule): one wake after a drain
// that stored any, none after a drain of duplicates only.
func TestADrainThatStoredWakesTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wakes := wake.NewSignal()
	b.ingest.WakeWith(wakes)
	d, q := drainer(t, b.ingest)
	ev := paid("evt_w1", "in_w1")
	q.Send("ingest", string(stripetest.EventBridge("eb-w1", stripetest.EventBridgeSource, ev)))
	q.Send("ingest", string(stripetest.EventBridge("eb-w2", stripetest.EventBridgeSource, paid("evt_w2", "in_w2"))))
	s, err := d.Drain(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, 2, s.Stored)
	require.Len(t, wakes, 1, "the drain woke the worker")
	<-wakes

	q.Send("ingest", string(stripetest.EventBridge("eb-w3", stripetest.EventBridgeSource, ev)))
	s, err = d.Drain(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, ingest.Summary{Duplicate: 1}, s)
	require.Empty(t, wakes, "a duplicate's receipt is already there: no wake")
}
