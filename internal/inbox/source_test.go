package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

func parsed(t *testing.T, id string) stripeevent.Event {
	t.Helper()
	ev, err := stripeevent.Parse(stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 100)))
	require.NoError(t, err)
	return ev
}

// TestStoreFromKeepsTheFirstSource: a listed copy never replaces anything
// (the reconciler's store is a duplicate of any receipt), and an unknown
// source is refused, by the code and by the table.
func TestStoreFromKeepsTheFirstSource(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()

	out, err := Store(ctx, db.Pool, "billing", parsed(t, "evt_w"))
	require.NoError(t, err)
	require.Equal(t, Stored, out)
	out, err = StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, "evt_w", "2024-06-20"))
	require.NoError(t, err)
	require.Equal(t, Duplicate, out)
	out, err = StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, "evt_r", "2024-06-20"))
	require.NoError(t, err)
	require.Equal(t, Stored, out)
	out, err = StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, "evt_r", "2025-03-31.basil"))
	require.NoError(t, err)
	require.Equal(t, Duplicate, out, "a listed copy does not replace another")

	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_w' AND source = 'webhook' AND NOT listed_first AND api_version = $1", stripetest.APIVersion))
	require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_r' AND source = 'reconcile' AND listed_first AND api_version = '2024-06-20'"))

	_, err = StoreFrom(ctx, db.Pool, Source("elsewhere"), "billing", parsed(t, "evt_x"))
	require.ErrorContains(t, err, `unknown source "elsewhere"`)
	require.Equal(t, 0, db.Count(t, "webhook_inbox", "event_id = 'evt_x'"))
	_, err = db.Pool.Exec(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload, source)
		VALUES ('stripe', 'billing', 'evt_y', 'x', false, '{}', 'elsewhere')`)
	require.ErrorContains(t, err, "webhook_inbox_source_check")
}

// parsedIn is parsed with another api_version, as the Events API renders an
// event created while the account had it.
func parsedIn(t *testing.T, id, version string) stripeevent.Event {
	t.Helper()
	ev := parsed(t, id)
	var m map[string]any
	require.NoError(t, json.Unmarshal(ev.Payload, &m))
	m["api_version"] = version
	b, err := json.Marshal(m)
	require.NoError(t, err)
	ev, err = stripeevent.Parse(b)
	require.NoError(t, err)
	return ev
}

// delivered is id as the endpoint delivers it: signed, in its version.
func delivered(t *testing.T, id string) stripeevent.Event {
	t.Helper()
	payload := stripetest.Event(id, "invoice.paid", stripetest.Invoice("in_"+id, "cus_1", "paid", 100))
	ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	return ev
}

// TestDeliveryReplacesTheListedCopyWhileUnprocessed: the endpoint's delivery
// is the copy that counts. When the reconciler stored the event first and
// the receipt is unprocessed, the delivery's payload, version, source,
// fingerprint and signing time replace the listed copy in the store's one
// statement (Replaced; listed_first says the reconciler had it first), and
// the worker's state is left as it is. A processed receipt, or one the
// endpoint delivered itself, is a duplicate and does not change.
func TestDeliveryReplacesTheListedCopyWhileUnprocessed(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	cases := []struct {
		name   string
		before func(ctx context.Context, id string) error
		want   StoreOutcome
	}{
		{"listed, unprocessed", func(ctx context.Context, id string) error {
			_, err := StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, id, "2024-06-20"))
			return err
		}, Replaced},
		{"listed, failed and waiting for review", func(ctx context.Context, id string) error {
			if _, err := StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, id, "2024-06-20")); err != nil {
				return err
			}
			_, err := db.Pool.Exec(ctx, `UPDATE webhook_inbox SET attempts = 10, available_at = 'infinity', last_error = 'bad_payload: x' WHERE event_id = $1`, id)
			return err
		}, Replaced},
		{"listed, processed", func(ctx context.Context, id string) error {
			if _, err := StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, id, "2024-06-20")); err != nil {
				return err
			}
			_, err := db.Pool.Exec(ctx, `UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied' WHERE event_id = $1`, id)
			return err
		}, Duplicate},
		{"delivered, unprocessed", func(ctx context.Context, id string) error {
			_, err := Store(ctx, db.Pool, "billing", parsedIn(t, id, "2024-06-20"))
			return err
		}, Duplicate},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			id := fmt.Sprintf("evt_case_%d", i)
			require.NoError(t, tc.before(ctx, id))
			type row struct {
				Version, Source, Payload, Error string
				Listed                          bool
				Fingerprint                     *string
				Attempts                        int
				Available                       string
			}
			read := func() row {
				var r row
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT api_version, source, payload::text, coalesce(last_error, ''), listed_first,
				       secret_fingerprint, attempts, available_at::text FROM webhook_inbox WHERE event_id = $1`, id).
					Scan(&r.Version, &r.Source, &r.Payload, &r.Error, &r.Listed, &r.Fingerprint, &r.Attempts, &r.Available))
				return r
			}
			was := read()

			for _, store := range []func(context.Context, DB, string, stripeevent.Event) (StoreOutcome, error){Store, StoreAndNotify} {
				out, err := store(ctx, db.Pool, "billing", delivered(t, id))
				require.NoError(t, err)
				now := read()
				if tc.want != Replaced {
					require.Equal(t, Duplicate, out)
					require.Equal(t, was, now, "nothing changes")
					continue
				}
				require.Equal(t, Replaced, out, "the delivery replaced the listed copy")
				require.Equal(t, stripetest.APIVersion, now.Version)
				require.Equal(t, "webhook", now.Source)
				require.True(t, now.Listed)
				require.NotNil(t, now.Fingerprint)
				require.Contains(t, now.Payload, `"api_version": "`+stripetest.APIVersion+`"`)
				require.Equal(t, []any{was.Attempts, was.Available, was.Error}, []any{now.Attempts, now.Available, now.Error}, "the worker's state is the worker's")
				tc.want = Duplicate // the second delivery is a duplicate of the delivery
				was = now
			}
		})
	}
}

// TestDeliveryWaitsForTheWorkerHoldingTheListedReceipt: a worker is
// processing the listed copy (its transaction holds the row) when the
// delivery arrives. The delivery waits for it: if the worker commits, the
// receipt is processed and the delivery is a duplicate that changes
// nothing; if the worker's transaction rolls back, the delivery replaces the
// listed copy, which the next attempt books.
func TestDeliveryWaitsForTheWorkerHoldingTheListedReceipt(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("worker commits %v", commit), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			ctx := context.Background()
			_, err := StoreFrom(ctx, db.Pool, SourceReconcile, "billing", parsedIn(t, "evt_held", "2024-06-20"))
			require.NoError(t, err)

			worker, err := db.Connect(t).Begin(ctx)
			require.NoError(t, err)
			key := Key{Provider: ProviderStripe, Endpoint: "billing", EventID: "evt_held"}
			locked, found, err := Lock(ctx, worker, key)
			require.NoError(t, err)
			require.True(t, found)
			require.Contains(t, string(locked.Payload), `"2024-06-20"`, "the worker holds the listed copy")

			type result struct {
				out StoreOutcome
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := Store(ctx, db.Pool, "billing", delivered(t, "evt_held"))
				done <- result{out, err}
			}()
			db.WaitUntil(t, "the delivery waits for the worker's row lock",
				`SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO webhook_inbox AS w%'`)
			if commit {
				_, err = MarkProcessed(ctx, worker, key, "applied", nil)
				require.NoError(t, err)
				require.NoError(t, worker.Commit(ctx))
			} else {
				require.NoError(t, worker.Rollback(ctx))
			}
			r := <-done
			require.NoError(t, r.err)
			if commit {
				require.Equal(t, Duplicate, r.out)
				require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_held' AND source = 'reconcile' AND api_version = '2024-06-20' AND processed_at IS NOT NULL"))
			} else {
				require.Equal(t, Replaced, r.out)
				require.Equal(t, 1, db.Count(t, "webhook_inbox", "event_id = 'evt_held' AND source = 'webhook' AND listed_first AND api_version = $1 AND processed_at IS NULL", stripetest.APIVersion))
			}
		})
	}
}

// TestContentGuard: the table refuses any change of a receipt's content but
// a delivery replacing a listed copy of an unprocessed receipt and the
// purge's scrub of a processed one, whoever asks (migrations/0014).
func TestContentGuard(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	_, err := Store(ctx, db.Pool, "billing", delivered(t, "evt_g"))
	require.NoError(t, err)
	for _, q := range []string{
		"UPDATE webhook_inbox SET payload = '{}' WHERE event_id = 'evt_g'",
		"UPDATE webhook_inbox SET api_version = '2020-01-01' WHERE event_id = 'evt_g'",
		"UPDATE webhook_inbox SET source = 'reconcile' WHERE event_id = 'evt_g'",
		"UPDATE webhook_inbox SET payload = '{\"scrubbed\": true}', payload_raw = NULL WHERE event_id = 'evt_g'", // not processed yet
	} {
		_, err := db.Pool.Exec(ctx, q)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, q)
		require.Equal(t, "42501", pgErr.Code, q)
		require.Contains(t, pgErr.Message, "its content changes only when", q)
	}
	_, err = db.Pool.Exec(ctx, "UPDATE webhook_inbox SET payload = payload, api_version = api_version WHERE event_id = 'evt_g'")
	require.NoError(t, err, "an UPDATE that changes nothing")
	_, err = db.Pool.Exec(ctx, "UPDATE webhook_inbox SET processed_at = now(), outcome = 'applied' WHERE event_id = 'evt_g'")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE webhook_inbox SET payload = '{\"scrubbed\": true}', payload_raw = NULL WHERE event_id = 'evt_g'")
	require.NoError(t, err, "the purge's scrub of a processed receipt")
}

// TestHighWaterOnlyMovesForward: the mark is absent until first set, and a
// mark older than the stored one (a backfill, a racing reconciler) leaves it.
func TestHighWaterOnlyMovesForward(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()

	_, ok, err := HighWater(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.False(t, ok)

	t1 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got, err := AdvanceHighWater(ctx, db.Pool, "billing", t1)
	require.NoError(t, err)
	require.True(t, got.Equal(t1))
	got, err = AdvanceHighWater(ctx, db.Pool, "billing", t1.Add(-time.Hour))
	require.NoError(t, err)
	require.True(t, got.Equal(t1), "never backwards")
	hw, ok, err := HighWater(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, hw.Equal(t1))

	_, ok, err = HighWater(ctx, db.Pool, "connect")
	require.NoError(t, err)
	require.False(t, ok, "one mark per endpoint")
}
