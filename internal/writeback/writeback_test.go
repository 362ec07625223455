package writeback_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeapitest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

var writebacksOn = handlers.New(handlers.Options{Writebacks: []string{handlers.WritebackCustomerMetadata}})

type bundle struct {
	db     *pgtest.Database
	stripe *stripeapitest.Server
	seq    int
}

func setup(t *testing.T, customers ...string) *bundle {
	t.Helper()
	b := &bundle{db: pgtest.DB(t), stripe: stripeapitest.New(customers...)}
	t.Cleanup(b.stripe.Close)
	return b
}

// testConfig: backoffs short enough that a retried intent is due again
// while the test waits for it (tests wait for states, never for time).
func testConfig() writeback.Config {
	return writeback.Config{ClaimLimit: 10, Lease: time.Minute, CallTimeout: 10 * time.Second, MaxAttempts: 5,
		BackoffBase: time.Millisecond, BackoffCap: 5 * time.Millisecond}
}

func (b *bundle) sender(t *testing.T, cfg writeback.Config) *writeback.Sender {
	t.Helper()
	return b.senderWith(t, writeback.DBStore{DB: b.db.Pool}, cfg)
}

// senderWith is a sender on store, calling the bundle's stand-in.
func (b *bundle) senderWith(t *testing.T, store writeback.Store, cfg writeback.Config) *writeback.Sender {
	t.Helper()
	api, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: b.stripe.URL})
	require.NoError(t, err)
	s, err := writeback.New(store, api, cfg, nil, nil)
	require.NoError(t, err)
	return s
}

// pay applies an invoice.paid Event object (a new event id each call) in a
// committed transaction, as the worker does.
func (b *bundle) pay(t *testing.T, invoice, customer string) {
	t.Helper()
	b.seq++
	id := fmt.Sprintf("evt_%s_%d", invoice, b.seq)
	payload := stripetest.EventWith(id, "invoice.paid", stripetest.Meta{Created: stripetest.Created + int64(b.seq), Livemode: true},
		stripetest.Invoice(invoice, customer, "paid", 2000))
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = writebacksOn.Apply(ctx, tx, handlers.Event{ID: id, Type: "invoice.paid", Endpoint: "billing", Payload: payload, Livemode: true})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func (b *bundle) run(t *testing.T, s *writeback.Sender) writeback.Summary {
	t.Helper()
	sum, err := s.Run(context.Background())
	require.NoError(t, err)
	return sum
}

// runUntilRecorded runs the sender until no intent is pending (a retried
// intent is due again after its short backoff).
func (b *bundle) runUntilSettled(t *testing.T, s *writeback.Sender) {
	t.Helper()
	for range 1000 {
		b.run(t, s)
		if b.db.Count(t, "writeback_intents", "status = 'pending'") == 0 {
			return
		}
	}
	t.Fatalf("write-backs still pending: %s", b.stripe)
}

func (b *bundle) intent(t *testing.T, invoice string) (status, via string, attempts int) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT status, coalesce(result_via, ''), attempts FROM writeback_intents WHERE idempotency_key = $1",
		handlers.CustomerMetadataKey(invoice)).Scan(&status, &via, &attempts))
	return status, via, attempts
}

func posts(rs []stripeapitest.Request) []stripeapitest.Request {
	var out []stripeapitest.Request
	for _, r := range rs {
		if r.Method == http.MethodPost {
			out = append(out, r)
		}
	}
	return out
}

// Two Event objects for one payment: one intent, one applied call, the
// result recorded; runs after it call nothing.
func TestTwoEventObjectsOneIntentOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	b.pay(t, "in_1", "cus_1")
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "true"))
	s := b.sender(t, testConfig())
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Calls)
	require.Equal(t, 1, sum.Done)
	require.Equal(t, 1, b.stripe.Applied(handlers.CustomerMetadataKey("in_1")))
	require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_1"}, b.stripe.Metadata("cus_1"))
	status, via, _ := b.intent(t, "in_1")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaCall, via)
	var resultID string
	var result map[string]any
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT result_id, result FROM writeback_intents").Scan(&resultID, &result))
	require.Equal(t, "cus_1", resultID)
	require.NotEmpty(t, result["request_id"])
	delete(result, "request_id")
	require.Equal(t, map[string]any{"id": "cus_1", "metadata": map[string]any{handlers.LastPaidInvoiceKey: "in_1"}, "replayed": false}, result,
		"what identifies the effect, not the customer (email, name, address)")
	before := len(b.stripe.Requests())
	b.run(t, s)
	require.Len(t, b.stripe.Requests(), before, "a recorded intent is never called again")
}

// A claim the database committed whose answer reached the sender only
// after the run's context ended gives its intents back, due at once and
// their attempt uncounted, and sends nothing: the next run sends them, not
// the end of their lease. The answer is held on the wire until the claim
// has committed and the context is cancelled.
func TestAClaimAnsweredAfterTheRunEndedGivesItsIntentsBack(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1", "cus_2")
	pool, gate := b.db.GatedPool(t, 1)
	s := b.senderWith(t, writeback.DBStore{DB: pool}, testConfig())
	// A first run (nothing due) prepares the claim on the pool's one
	// connection: pgx prepares a statement the first time, and waits for
	// that answer before it sends the statement.
	require.Equal(t, 0, b.run(t, s).Claimed)
	b.pay(t, "in_1", "cus_1")
	b.pay(t, "in_2", "cus_2")

	gate.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(ctx)
		done <- err
	}()
	b.db.WaitUntil(t, "the claim has committed", "SELECT count(*) = 2 FROM writeback_intents WHERE claim_token IS NOT NULL")
	cancel()
	gate.OpenOnDeadline(time.Second)
	require.NoError(t, <-done)

	require.Empty(t, posts(b.stripe.Requests()), "nothing is sent once the run has ended")
	require.Equal(t, 2, b.db.Count(t, "writeback_intents", "status = 'pending' AND claim_token IS NULL AND attempts = 0 AND available_at <= now()"),
		"the claimed intents are given back, due now, attempt uncounted")
	sum := b.run(t, s)
	require.Equal(t, 2, sum.Done)
}

// An ambiguous failure (the request ran, the answer was lost: a reset; or
// a 503 before it ran) is retried with the same key, and the stand-in
// applies it once. A request that ran and then failed with a 500 saved the
// 500 under the key, and Stripe replays it (Idempotent-Replayed: true): the
// sender reads the effect back at once and records it, instead of
// retrying a key that can only answer the 500 again.
func TestAmbiguousFailureRetriedWithTheSameKeyAppliedOnce(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		fault     stripeapitest.Fault
		via       string
		attempts  int
		readBacks int
	}{
		"ran, then the connection was reset": {stripeapitest.Fault{Method: http.MethodPost, ApplyThenFail: true}, writeback.ViaCall, 3, 0},
		"ran, then a 500 (saved and replayed)": {stripeapitest.Fault{Method: http.MethodPost, ApplyThenFail: true, Status: 500},
			writeback.ViaReadBack, 2, 1},
		"a 503 before it ran": {stripeapitest.Fault{Method: http.MethodPost, Status: 503}, writeback.ViaCall, 3, 0},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "cus_1")
			b.pay(t, "in_1", "cus_1")
			b.stripe.Fail(tc.fault, tc.fault)
			s := b.sender(t, testConfig())
			sum := b.run(t, s)
			require.Equal(t, 1, sum.Retried)
			status, _, attempts := b.intent(t, "in_1")
			require.Equal(t, "pending", status)
			require.Equal(t, 1, attempts)
			b.runUntilSettled(t, s)
			status, via, attempts := b.intent(t, "in_1")
			require.Equal(t, "done", status)
			require.Equal(t, tc.via, via)
			require.Equal(t, tc.attempts, attempts)
			key := handlers.CustomerMetadataKey("in_1")
			rs := b.stripe.Requests()
			ps := posts(rs)
			require.Len(t, ps, tc.attempts)
			for _, p := range ps {
				require.Equal(t, key, p.IdempotencyKey, "every attempt carries the intent's key")
			}
			require.Len(t, rs, tc.attempts+tc.readBacks)
			require.Equal(t, 1, b.stripe.Applied(key), "applied once")
			require.Equal(t, 1, b.stripe.AppliedTotal())
			require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_1"}, b.stripe.Metadata("cus_1"))
		})
	}
}

// A replayed 500 whose effect is not there (the metadata was changed since
// the request ran) parks the intent as refused: retrying with the key can
// only replay the 500; an operator's retry sends under the key's next
// generation.
func TestReplayed500NotInEffectParksForANewKey(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, ApplyThenFail: true, Status: 500})
	s := b.sender(t, testConfig())
	require.Equal(t, 1, b.run(t, s).Retried)
	b.stripe.AddCustomer("cus_1", nil) // someone cleared the metadata since
	b.runUntilSettled(t, s)
	status, _, attempts := b.intent(t, "in_1")
	require.Equal(t, "parked", status)
	require.Equal(t, 2, attempts, "parked at once, not after MaxAttempts")
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "refused AND last_error LIKE '%replays a saved 500%'"))
	ok, err := writeback.RetryParked(context.Background(), b.db.Pool, b.intentID(t, "in_1"))
	require.NoError(t, err)
	require.True(t, ok)
	b.runUntilSettled(t, s)
	status, via, _ := b.intent(t, "in_1")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaCall, via)
	require.Equal(t, 1, b.stripe.Applied(handlers.CustomerMetadataKey("in_1")+":retry1"))
	require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_1"}, b.stripe.Metadata("cus_1"))
}

// Once the stand-in has forgotten every key (Stripe may, after 24 hours),
// neither a redelivery of the payment's events nor another run of the
// sender calls anything: the recorded result is what stops it.
func TestForgottenKeysRedeliveryAndRerunCallNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	s := b.sender(t, testConfig())
	b.runUntilSettled(t, s)
	require.Equal(t, 1, b.stripe.AppliedTotal())
	b.stripe.Forget()
	before := len(b.stripe.Requests())
	b.pay(t, "in_1", "cus_1") // day three: Stripe redelivers, and another Event object
	b.pay(t, "in_1", "cus_1")
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "true"))
	b.run(t, s)
	b.run(t, b.sender(t, testConfig())) // a new sender process
	require.Len(t, b.stripe.Requests(), before)
	require.Equal(t, 1, b.stripe.AppliedTotal())
}

// A 4xx retrying cannot fix (no such customer) parks the intent; once the
// cause is fixed, an operator's retry sends it.
func TestPermanent4xxParksAndRetrySendsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.pay(t, "in_1", "cus_gone")
	s := b.sender(t, testConfig())
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Parked)
	status, _, _ := b.intent(t, "in_1")
	require.Equal(t, "parked", status)
	var lastError string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT last_error FROM writeback_intents").Scan(&lastError))
	require.Contains(t, lastError, "404")
	require.Contains(t, lastError, "No such customer")
	bl, err := writeback.ReadBacklog(context.Background(), b.db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, writeback.Backlog{Parked: 1}, bl)
	b.run(t, s)
	require.Len(t, posts(b.stripe.Requests()), 1, "a parked intent is not sent by itself")

	// The 404 is saved under the key (the endpoint ran), and Stripe would
	// replay it: the retry of a refusal sends under the next generation of
	// the key. A refusal changed nothing, so a new key cannot apply twice.
	b.stripe.AddCustomer("cus_gone", nil)
	id := b.intentID(t, "in_1")
	ok, err := writeback.RetryParked(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	require.True(t, ok)
	b.run(t, s)
	status, via, _ := b.intent(t, "in_1")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaCall, via)
	require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_1"}, b.stripe.Metadata("cus_gone"))
	ps := posts(b.stripe.Requests())
	require.Len(t, ps, 2)
	require.Equal(t, handlers.CustomerMetadataKey("in_1"), ps[0].IdempotencyKey)
	require.Equal(t, handlers.CustomerMetadataKey("in_1")+":retry1", ps[1].IdempotencyKey)
	require.Equal(t, 1, b.stripe.AppliedTotal())
	ok, err = writeback.RetryParked(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	require.False(t, ok, "only a parked intent is retried")
}

func (b *bundle) intentID(t *testing.T, invoice string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT id FROM writeback_intents WHERE idempotency_key = $1",
		handlers.CustomerMetadataKey(invoice)).Scan(&id))
	return id
}

// A 429 gives the intent back with its attempt uncounted, due no sooner
// than Stripe's Retry-After, and pauses the sender.
func TestThrottledHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, Status: 429, RetryAfter: "120"})
	s := b.sender(t, testConfig())
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Throttled)
	status, _, attempts := b.intent(t, "in_1")
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts, "a 429 gives its attempt back")
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "available_at >= now() + interval '119 seconds'"))
	require.True(t, b.run(t, s).Paused)
	require.Equal(t, 0, b.stripe.AppliedTotal())
}

// After the key lifetime the sender reads back first: an effect already in
// effect is recorded without a call (the call ran but its answer was lost,
// and Stripe has forgotten the key); one that is not is sent, once.
func TestAfterTheKeyLifetimeReadBackFirst(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		fault   stripeapitest.Fault
		applied int
		via     string
	}{
		"the first call ran":         {stripeapitest.Fault{Method: http.MethodPost, ApplyThenFail: true}, 1, writeback.ViaReadBack},
		"the first call did not run": {stripeapitest.Fault{Method: http.MethodPost, Status: 500}, 1, writeback.ViaCall},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "cus_1")
			b.pay(t, "in_1", "cus_1")
			b.stripe.Fail(tc.fault)
			cfg := testConfig()
			cfg.BackoffBase, cfg.BackoffCap = time.Hour, time.Hour // no retry inside the day
			s := b.sender(t, cfg)
			require.Equal(t, 1, b.run(t, s).Retried)
			// The third day: the key is gone, the intent is due.
			b.stripe.Forget()
			_, err := b.db.Pool.Exec(context.Background(),
				"UPDATE writeback_intents SET first_attempt_at = now() - interval '49 hours', available_at = now()")
			require.NoError(t, err)
			sum := b.run(t, s)
			require.Equal(t, 1, sum.ReadBacks)
			status, via, _ := b.intent(t, "in_1")
			require.Equal(t, "done", status)
			require.Equal(t, tc.via, via)
			require.Equal(t, tc.applied, b.stripe.AppliedTotal())
		})
	}
}

// An older intent for a customer whose newer intent is recorded is
// recorded as superseded, without a call: it would put the older invoice
// back.
func TestOlderIntentSupersededByANewerOneRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_old", "cus_1")
	b.pay(t, "in_new", "cus_1")
	_, err := b.db.Pool.Exec(context.Background(), "UPDATE writeback_intents SET available_at = now() + interval '1 hour' WHERE idempotency_key = $1",
		handlers.CustomerMetadataKey("in_old"))
	require.NoError(t, err)
	s := b.sender(t, testConfig())
	b.run(t, s)
	_, err = b.db.Pool.Exec(context.Background(), "UPDATE writeback_intents SET available_at = now() WHERE status = 'pending'")
	require.NoError(t, err)
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Superseded)
	require.Equal(t, 0, sum.Calls)
	status, via, _ := b.intent(t, "in_old")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaSuperseded, via)
	require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_new"}, b.stripe.Metadata("cus_1"))
}

// A sender whose lease ended cannot record over the claim that owns the
// intent now.
func TestStaleClaimCannotRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	ctx := context.Background()
	store := writeback.DBStore{DB: b.db.Pool}
	stale, intents, err := store.Claim(ctx, 10, time.Minute, writeback.KeyLifetime)
	require.NoError(t, err)
	require.Len(t, intents, 1)
	later := time.Now().Add(time.Hour)
	owner, again, err := writeback.DBStore{DB: b.db.Pool, Now: func() *time.Time { return &later }}.Claim(ctx, 10, time.Minute, writeback.KeyLifetime)
	require.NoError(t, err)
	require.Len(t, again, 1)
	n, err := store.Record(ctx, stale, 5, []writeback.Outcome{{ID: intents[0].ID, Kind: writeback.Park, Error: "stale"}})
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = store.Record(ctx, owner, 5, []writeback.Outcome{{ID: intents[0].ID, Kind: writeback.Done, Via: writeback.ViaCall, ResultID: "cus_1"}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	status, _, attempts := b.intent(t, "in_1")
	require.Equal(t, "done", status)
	require.Equal(t, 2, attempts)
}

// Ambiguous failures without end park the intent at MaxAttempts.
func TestAmbiguousFailuresParkAtMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	cfg := testConfig()
	for range cfg.MaxAttempts {
		b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, Status: 502})
	}
	b.runUntilSettled(t, b.sender(t, cfg))
	status, _, attempts := b.intent(t, "in_1")
	require.Equal(t, "parked", status)
	require.Equal(t, cfg.MaxAttempts, attempts)
	require.Zero(t, b.stripe.AppliedTotal())
}

// An intent parked after ambiguous failures (the call may have run) keeps
// its key when an operator retries it: Stripe replays the run, never runs it
// twice.
func TestRetryAfterAmbiguousFailuresKeepsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	cfg := testConfig()
	b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, ApplyThenFail: true})
	for range cfg.MaxAttempts - 1 {
		b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, Status: 502})
	}
	s := b.sender(t, cfg)
	b.runUntilSettled(t, s)
	status, _, _ := b.intent(t, "in_1")
	require.Equal(t, "parked", status)
	ok, err := writeback.RetryParked(context.Background(), b.db.Pool, b.intentID(t, "in_1"))
	require.NoError(t, err)
	require.True(t, ok)
	b.runUntilSettled(t, s)
	status, _, _ = b.intent(t, "in_1")
	require.Equal(t, "done", status)
	for _, p := range posts(b.stripe.Requests()) {
		require.Equal(t, handlers.CustomerMetadataKey("in_1"), p.IdempotencyKey)
	}
	require.Equal(t, 1, b.stripe.AppliedTotal())
}

// An older intent that failed once (due later) and a newer intent for the
// same customer, both due in one batch with the newer one first by
// available_at: the older one is superseded by the newer pending one, and
// the customer ends with the newer invoice.
func TestOlderIntentInTheSameBatchSupersededByANewerPendingOne(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_old", "cus_1")
	b.pay(t, "in_new", "cus_1")
	ctx := context.Background()
	// in_old failed once: due after in_new (a 5xx's backoff).
	_, err := b.db.Pool.Exec(ctx, `UPDATE writeback_intents SET attempts = 1, first_attempt_at = now() - interval '1 minute',
	        available_at = now() - interval '1 minute', last_error = '503' WHERE idempotency_key = $1`, handlers.CustomerMetadataKey("in_old"))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "UPDATE writeback_intents SET available_at = now() - interval '2 minutes' WHERE idempotency_key = $1",
		handlers.CustomerMetadataKey("in_new"))
	require.NoError(t, err)
	s := b.sender(t, testConfig())
	sum := b.run(t, s)
	require.Equal(t, 2, sum.Claimed)
	require.Equal(t, 1, sum.Superseded)
	require.Equal(t, 1, sum.Calls)
	status, via, _ := b.intent(t, "in_old")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaSuperseded, via)
	require.Equal(t, map[string]string{handlers.LastPaidInvoiceKey: "in_new"}, b.stripe.Metadata("cus_1"))
}

// A 400 idempotency_error (the key was used before with other parameters:
// that earlier request ran, and may have changed the customer) parks the
// intent as not refused: an operator's retry keeps the key, it does not
// send under a new one as if Stripe had changed nothing.
func TestIdempotencyErrorParksNotRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	api, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: b.stripe.URL})
	require.NoError(t, err)
	_, err = api.UpdateCustomerMetadata(context.Background(), "cus_1", map[string]string{"other": "x"}, handlers.CustomerMetadataKey("in_1"))
	require.NoError(t, err)
	s := b.sender(t, testConfig())
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Parked)
	var refused bool
	var lastError string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT refused, last_error FROM writeback_intents").Scan(&refused, &lastError))
	require.False(t, refused, "an idempotency_error means an earlier request with the key ran")
	require.Contains(t, lastError, "idempotency_error")
	ok, err := writeback.RetryParked(context.Background(), b.db.Pool, b.intentID(t, "in_1"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "key_generation = 0"), "the retry keeps the key")
}

// A 409 (idempotency_key_in_use: a concurrent request with the key is
// running) is ambiguous: retried with the same key, applied once.
func TestConflict409RetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1")
	b.pay(t, "in_1", "cus_1")
	b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, Status: http.StatusConflict})
	s := b.sender(t, testConfig())
	require.Equal(t, 1, b.run(t, s).Retried)
	b.runUntilSettled(t, s)
	status, via, attempts := b.intent(t, "in_1")
	require.Equal(t, "done", status)
	require.Equal(t, writeback.ViaCall, via)
	require.Equal(t, 2, attempts)
	ps := posts(b.stripe.Requests())
	require.Len(t, ps, 2)
	for _, p := range ps {
		require.Equal(t, handlers.CustomerMetadataKey("in_1"), p.IdempotencyKey)
	}
	require.Equal(t, 1, b.stripe.AppliedTotal())
}

// testClock is a sender clock a test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// An intent is sent only while at least twice the call timeout of its
// claim's lease is left: when the first call of a batch took the lease's
// time, the second intent is given back uncounted, not sent while another
// sender may claim it; the next run sends it under a fresh lease.
func TestNotSentWhenTooLittleOfTheLeaseIsLeft(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1", "cus_2")
	b.pay(t, "in_1", "cus_1")
	b.pay(t, "in_2", "cus_2")
	cfg := testConfig()
	clock := &testClock{t: time.Now()}
	// The first POST takes the lease's time (on the sender's clock).
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.stripe.ServeHTTP(w, r)
		if r.Method == http.MethodPost && len(posts(b.stripe.Requests())) == 1 {
			clock.Add(cfg.Lease)
		}
	}))
	t.Cleanup(slow.Close)
	api, err := writeback.NewClient(writeback.ClientConfig{Key: stripeapitest.Key, BaseURL: slow.URL})
	require.NoError(t, err)
	s, err := writeback.New(writeback.DBStore{DB: b.db.Pool}, api, cfg, nil, nil)
	require.NoError(t, err)
	s.Clock = clock.Now
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Calls)
	require.Equal(t, 1, sum.LeaseShort)
	status, _, attempts := b.intent(t, "in_2")
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts, "given back uncounted")
	require.Len(t, posts(b.stripe.Requests()), 1)
	sum = b.run(t, s)
	require.Equal(t, 1, sum.Calls)
	status, _, _ = b.intent(t, "in_2")
	require.Equal(t, "done", status)
}

// After a 429, the intents left in the batch are due when the pause ends,
// not at once; and a 2xx resets the 429 backoff: the next 429's pause is
// the first step's again.
func TestThrottledPauseDelaysTheBatchAndA2xxResetsTheBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t, "cus_1", "cus_2", "cus_3")
	b.pay(t, "in_1", "cus_1")
	b.pay(t, "in_2", "cus_2")
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffCap = time.Hour, 8*time.Hour
	s := b.sender(t, cfg)
	s.Jitter = func() float64 { return 0 } // backoff(n) = base·2^(n−1) / 2
	clock := &testClock{t: time.Now()}
	s.Clock = clock.Now
	b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, Status: 429})
	sum := b.run(t, s)
	require.Equal(t, 1, sum.Throttled)
	require.Equal(t, 2, b.db.Count(t, "writeback_intents", "status = 'pending' AND attempts = 0 AND available_at >= now() + interval '29 minutes'"),
		"both due when the 30-minute pause ends")

	clock.Add(time.Hour)
	_, err := b.db.Pool.Exec(context.Background(), "UPDATE writeback_intents SET available_at = now()")
	require.NoError(t, err)
	sum = b.run(t, s)
	require.Equal(t, 2, sum.Done)

	b.pay(t, "in_3", "cus_3")
	b.stripe.Fail(stripeapitest.Fault{Method: http.MethodPost, Status: 429})
	clock.Add(time.Hour)
	require.Equal(t, 1, b.run(t, s).Throttled)
	require.Equal(t, 1, b.db.Count(t, "writeback_intents", "status = 'pending' AND available_at < now() + interval '45 minutes'"),
		"a 2xx reset the backoff: 30 minutes again, not an hour")
}
