package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// recordingWaker counts wakes and, at each, how many receipts another
// connection sees: a wake must come after the commit, or the worker it
// starts could find nothing and exit before the receipt exists.
type recordingWaker struct {
	t       *testing.T
	db      *pgtest.Database
	err     error
	mu      sync.Mutex
	visible []int
}

func (w *recordingWaker) Wake(ctx context.Context) error {
	var n int
	require.NoError(w.t, w.db.Pool.QueryRow(ctx, "SELECT count(*) FROM webhook_inbox").Scan(&n))
	w.mu.Lock()
	w.visible = append(w.visible, n)
	w.mu.Unlock()
	return w.err
}

func TestANewReceiptWakesTheWorkerAfterItCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := &recordingWaker{t: t, db: b.db}
	b.handler.WakeWith(w)

	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("billing", "evt_w1", "invoice.paid", secretA))))
	require.Equal(t, []int{1}, w.visible, "one wake, with the receipt already committed")

	require.Equal(t, "duplicate", outcomeOf(t, b.do(t, signedRequest("billing", "evt_w1", "invoice.paid", secretA))))
	require.Equal(t, []int{1}, w.visible, "a duplicate's receipt is already there: no wake")

	resp := b.do(t, signedRequest("billing", "evt_w2", "invoice.paid", "whsec_wrong"))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, []int{1}, w.visible, "a refused request stores nothing and wakes nothing")

	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("connect", "evt_w3", "invoice.paid", secretB))))
	require.Equal(t, []int{1, 2}, w.visible)
}

func TestAFailedWakeStillAnswersStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := &recordingWaker{t: t, db: b.db, err: errors.New("Lambda answered 429")}
	b.handler.WakeWith(w)

	require.Equal(t, "stored", outcomeOf(t, b.do(t, signedRequest("billing", "evt_w4", "invoice.paid", secretA))))
	require.Len(t, w.visible, 1)
	require.Equal(t, 1, b.db.Count(t, "webhook_inbox", ""))
	require.Contains(t, b.logs.String(), "waking the worker failed; the schedule will apply the receipt")
	require.Contains(t, b.logs.String(), "Lambda answered 429")
}
