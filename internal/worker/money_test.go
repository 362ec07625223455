package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// Point 2: a refund is booked only once it has succeeded, and reversed once
// if it fails after that.
func TestRefundsAreBookedOnlyWhenSucceeded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	step := func(id, typ string, object map[string]any, want ...string) {
		t.Helper()
		b.receive(t, stripetest.Event(id, typ, object))
		b.run(t, w)
		require.Equal(t, want, b.ledger(t), "after %s", id)
	}
	// A refund created pending books nothing; it is booked once it
	// succeeds, once, whichever event says so; a failure after that books a
	// reversal, once.
	step("evt_1", "refund.created", stripetest.RefundIn("re_1", "ch_1", "pending", 300))
	step("evt_2", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300), "ch_1 refund:re_1 -300")
	step("evt_3", "charge.refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300), "ch_1 refund:re_1 -300")
	step("evt_4", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300), "ch_1 refund:re_1 -300", "ch_1 refund_reversal:re_1 300")
	step("evt_5", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "failed", 300), "ch_1 refund:re_1 -300", "ch_1 refund_reversal:re_1 300")
	// A late event that still shows it succeeded changes nothing.
	step("evt_6", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300), "ch_1 refund:re_1 -300", "ch_1 refund_reversal:re_1 300")

	// charge.refunded lists refunds of every status: only the succeeded one
	// is booked; a canceled one that never succeeded books nothing.
	b2 := setup(t)
	w2 := b2.newWorker(t, nil, worker.Config{Concurrency: 1})
	b2.receive(t, stripetest.Event("evt_1", "charge.refunded", stripetest.ChargeWithRefundList("ch_2", "in_2",
		stripetest.RefundIn("re_a", "ch_2", "succeeded", 100),
		stripetest.RefundIn("re_b", "ch_2", "pending", 200),
		stripetest.RefundIn("re_c", "ch_2", "failed", 300),
		stripetest.RefundIn("re_d", "ch_2", "canceled", 400),
		stripetest.RefundIn("re_e", "ch_2", "requires_action", 500))))
	b2.receive(t, stripetest.Event("evt_2", "refund.created", stripetest.RefundIn("re_e", "ch_2", "pending", 500)))
	b2.run(t, w2)
	require.Equal(t, []string{"in_2 refund:re_a -100"}, b2.ledger(t))
	b2.receive(t, stripetest.Event("evt_3", "refund.updated", stripetest.RefundIn("re_b", "ch_2", "succeeded", 200)))
	b2.receive(t, stripetest.Event("evt_4", "refund.updated", stripetest.RefundIn("re_e", "ch_2", "canceled", 500)))
	b2.run(t, w2)
	require.Equal(t, []string{"in_2 refund:re_a -100", "in_2 refund:re_b -200"}, b2.ledger(t))
	require.Equal(t, 0, b2.db.Count(t, "webhook_inbox", "processed_at IS NULL"))

	// A refund without a known status is refused, not booked.
	b3 := setup(t)
	b3.receive(t, stripetest.Event("evt_1", "refund.created", map[string]any{"id": "re_x", "object": "refund", "amount": 5, "currency": "usd", "charge": "ch_x"}))
	s := b3.run(t, b3.newWorker(t, nil, worker.Config{Concurrency: 1}))
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 1, b3.db.Count(t, "webhook_inbox", `last_error LIKE 'bad_payload: event evt_1 (refund.created, api_version 2025-03-31.basil): data.object.status is missing;%'`))
	require.Empty(t, b3.ledger(t))
}

// Point 2: succeeded -> failed gives the same ledger rows whichever of the
// two events is processed first.
func TestRefundThatFailsAfterSucceedingGivesTheSameRowsInEitherOrder(t *testing.T) {
	t.Parallel()
	succeeded := stripetest.Event("evt_s", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300))
	failed := stripetest.Event("evt_f", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300))
	want := []string{"ch_1 refund:re_1 -300", "ch_1 refund_reversal:re_1 300"}
	for name, order := range map[string][][]byte{"succeeded first": {succeeded, failed}, "failed first": {failed, succeeded}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.applyOneByOne(t, order...)
			require.Equal(t, want, b.ledger(t))
			require.Equal(t, 1, b.db.Count(t, "refunds", "id = 're_1' AND status = 'failed' AND succeeded"))
		})
	}
}

// Point 3: a refund ends attributed to its invoice, whichever event came
// first, including a refund booked before the charge -> invoice link was
// known; per-invoice totals include every refund.
func TestRefundIsAttributedToItsInvoiceInAnyOrder(t *testing.T) {
	t.Parallel()
	paidWithCharge := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
	paidWithCharge["charge"] = "ch_1" // API versions before basil
	paidWithPayments := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
	paidWithPayments["payments"] = map[string]any{"object": "list", "data": []any{ // basil, when included
		map[string]any{"object": "invoice_payment", "invoice": "in_1", "payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_1"}}}}
	refundPI := func(id, status string, amount int64) map[string]any {
		r := stripetest.RefundIn(id, "ch_1", status, amount)
		r["payment_intent"] = "pi_1" // basil events name the PaymentIntent, not the charge, as the invoice's payment
		return r
	}
	invoicePayment := map[string]any{"id": "inpay_1", "object": "invoice_payment", "invoice": "in_1", "status": "paid",
		"payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_1"}}
	want := []string{"in_1 payment 1000", "in_1 refund:re_1 -300"}
	cases := map[string][][]byte{
		"refund.created, then invoice.paid naming the charge": {
			stripetest.Event("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			stripetest.Event("evt_p", "invoice.paid", paidWithCharge)},
		"refund.created, then charge.refunded naming the invoice": {
			stripetest.Event("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			stripetest.Event("evt_c", "charge.refunded", stripetest.ChargeWithRefunds("ch_1", "in_1", map[string]int64{"re_1": 300})),
			stripetest.Event("evt_p", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))},
		"charge.refunded, then refund.created": {
			stripetest.Event("evt_c", "charge.refunded", stripetest.ChargeWithRefunds("ch_1", "in_1", map[string]int64{"re_1": 300})),
			stripetest.Event("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			stripetest.Event("evt_p", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))},
		"invoice.paid naming the charge, then refund.created": {
			stripetest.Event("evt_p", "invoice.paid", paidWithCharge),
			stripetest.Event("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300))},
		"a pending refund linked, then it succeeds and fails": {
			stripetest.Event("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "pending", 300)),
			stripetest.Event("evt_s", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			stripetest.Event("evt_p", "invoice.paid", paidWithCharge),
			stripetest.Event("evt_f", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300)),
			stripetest.Event("evt_r2", "refund.created", stripetest.RefundIn("re_3", "ch_1", "succeeded", 300))},
		"basil: refund by PaymentIntent, then invoice.paid listing its payments": {
			stripetest.Event("evt_r", "refund.created", refundPI("re_1", "succeeded", 300)),
			stripetest.Event("evt_p", "invoice.paid", paidWithPayments)},
		"basil: refund by PaymentIntent, then invoice_payment.paid": {
			stripetest.Event("evt_r", "refund.created", refundPI("re_1", "pending", 300)),
			stripetest.Event("evt_r2", "refund.updated", refundPI("re_1", "succeeded", 300)),
			stripetest.Event("evt_ip", "invoice_payment.paid", invoicePayment),
			stripetest.Event("evt_p", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))},
		"basil: invoice_payment.paid, then the refund": {
			stripetest.Event("evt_ip", "invoice_payment.paid", invoicePayment),
			stripetest.Event("evt_r", "refund.created", refundPI("re_1", "succeeded", 300)),
			stripetest.Event("evt_p", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))},
	}
	wants := map[string][]string{
		"a pending refund linked, then it succeeds and fails": {"in_1 payment 1000", "in_1 refund:re_1 -300", "in_1 refund:re_3 -300", "in_1 refund_reversal:re_1 300"},
	}
	for name, events := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.applyOneByOne(t, events...)
			w1 := want
			if w, ok := wants[name]; ok {
				w1 = w
			}
			require.Equal(t, w1, b.ledger(t))
			var total int64
			require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT coalesce(sum(amount), 0) FROM ledger_entries WHERE invoice_id = 'in_1'").Scan(&total))
			require.Equal(t, sumOf(w1, "in_1"), total, "the invoice's total includes every refund of its payments")
			require.Equal(t, 0, b.db.Count(t, "webhook_inbox", "processed_at IS NULL"))
		})
	}
}

// sumOf adds the amounts of the "invoice kind amount" lines of invoice inv.
func sumOf(lines []string, inv string) int64 {
	var total int64
	for _, l := range lines {
		var i, k string
		var a int64
		if n, _ := fmt.Sscan(l, &i, &k, &a); n == 3 && i == inv {
			total += a
		}
	}
	return total
}

// Point 4: customer_id, currency and amount_due follow the newest snapshot
// (by created, ties by status rank), whatever order the events are
// processed in; the status stays forward-only and ignores created.
func TestDescriptiveFieldsFollowTheNewestSnapshot(t *testing.T) {
	t.Parallel()
	snap := func(id, typ, status, customer, currency string, amount, created int64) []byte {
		inv := stripetest.Invoice("in_1", customer, status, amount)
		inv["currency"] = currency
		return stripetest.EventWith(id, typ, stripetest.Meta{Created: created}, inv)
	}
	type fields struct {
		Status, Customer, Currency string
		AmountDue                  int64
	}
	read := func(b *testBundle) fields {
		var f fields
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT status, customer_id, currency, amount_due FROM invoices WHERE id = 'in_1'").Scan(&f.Status, &f.Customer, &f.Currency, &f.AmountDue))
		return f
	}
	created := snap("evt_1", "invoice.created", "draft", "cus_old", "usd", 1000, 100)
	finalized := snap("evt_2", "invoice.finalized", "open", "cus_new", "eur", 1200, 200)
	// invoice.paid in the same second as the finalization: the status rank
	// makes it the newer snapshot.
	paidSameSecond := snap("evt_3", "invoice.paid", "paid", "cus_paid", "eur", 1300, 200)
	// A finalization snapshot stamped later than the payment (clock skew, or
	// a second Event object): its fields win, but it never reopens the invoice.
	lateFinalized := snap("evt_4", "invoice.finalized", "open", "cus_late", "gbp", 1400, 300)

	for name, tc := range map[string]struct {
		events [][]byte
		want   fields
	}{
		"oldest last":                {[][]byte{finalized, created}, fields{"open", "cus_new", "eur", 1200}},
		"oldest first":               {[][]byte{created, finalized}, fields{"open", "cus_new", "eur", 1200}},
		"tie broken by status, paid": {[][]byte{paidSameSecond, finalized, created}, fields{"paid", "cus_paid", "eur", 1300}},
		"tie, other order":           {[][]byte{created, finalized, paidSameSecond}, fields{"paid", "cus_paid", "eur", 1300}},
		"newer created, lower status": {[][]byte{paidSameSecond, lateFinalized, created},
			fields{"paid", "cus_late", "gbp", 1400}},
		"newer created first": {[][]byte{lateFinalized, created, paidSameSecond},
			fields{"paid", "cus_late", "gbp", 1400}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.applyOneByOne(t, tc.events...)
			require.Equal(t, tc.want, read(b))
			if tc.want.Status == "paid" {
				require.Equal(t, []string{"in_1 payment 1300"}, b.ledger(t))
				require.Equal(t, 1, b.db.Count(t, "outbox", ""))
			}
		})
	}
}

// Refunds booked before migration 0005 (under the charge, whatever their
// status) are taken as booked: a later failure reverses them once, a later
// success does not book them again, and a later link moves them to the
// invoice.
func TestRefundsBookedBeforeTheUpgradeAreReversedAndMovedOnce(t *testing.T) {
	t.Parallel()
	b := upgradedWith(t, `INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
		VALUES ('ch_1', 'refund:re_1', -300, 'usd', 'evt_old'), ('in_2', 'refund:re_2', -100, 'usd', 'evt_old')`)
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	paid := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
	paid["charge"] = "ch_1"
	for _, ev := range [][]byte{
		stripetest.Event("evt_2", "invoice.paid", paid),
		stripetest.Event("evt_1", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
		stripetest.Event("evt_3", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300)),
		stripetest.Event("evt_4", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300)),
	} {
		b.receive(t, ev)
		b.run(t, w)
	}
	require.Equal(t, []string{"in_1 payment 1000", "in_1 refund:re_1 -300", "in_1 refund_reversal:re_1 300", "in_2 refund:re_2 -100"}, b.ledger(t))
}

// upgradedWith returns a bundle on a database migrated up to 0004, then
// given the rows of sql (the ledger as the code before 0005 left it), then
// migrated to the end.
func upgradedWith(t *testing.T, sql string) *testBundle {
	t.Helper()
	db := pgtest.Empty(t)
	ctx := context.Background()
	conn := db.Connect(t)
	pgtest.MigrateBelow(t, conn, "0005")
	_, err := conn.Exec(ctx, sql)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, conn)
	require.NoError(t, err)

	pool, err := database.Open(ctx, database.Config{URL: db.URL, MaxConns: 4, PreparedStatements: true}, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{db: db, pool: pool, metrics: &bytes.Buffer{}, batchSize: testBatchSize(t)}
}

// A refund and its reversal are always booked under one key: the refund's
// invoice as soon as any event has told it, else one fallback key, whichever
// event computes which key. Review finding: each event recomputed the key,
// so a refund booked under one key was reversed under another.
func TestARefundAndItsReversalAreNeverSplitAcrossKeys(t *testing.T) {
	t.Parallel()
	// Booked under its invoice before 0005 (old charge.refunded, whose
	// charge named the invoice): a failure after the upgrade, whose event
	// names only the charge (no link known: the invoice was paid before
	// payment_links existed), is reversed under the invoice too.
	t.Run("booked under the invoice before the upgrade, then failed", func(t *testing.T) {
		t.Parallel()
		b := upgradedWith(t, `INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
			VALUES ('in_1', 'payment', 1000, 'usd', 'evt_old0'), ('in_1', 'refund:re_1', -300, 'usd', 'evt_old')`)
		w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
		b.receive(t, stripetest.Event("evt_f", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300)))
		b.run(t, w)
		require.Equal(t, []string{"in_1 payment 1000", "in_1 refund:re_1 -300", "in_1 refund_reversal:re_1 300"}, b.ledger(t))
		require.Equal(t, 1, b.db.Count(t, "refunds", "id = 're_1' AND booked_under = 'in_1'"))
	})
	// Booked under a py_ charge before 0005 (a charge of another payment
	// method): the backfill records its charge, so a later link of that
	// charge moves it, and its reversal goes next to it.
	t.Run("booked under a py_ charge before the upgrade, then linked and failed", func(t *testing.T) {
		t.Parallel()
		b := upgradedWith(t, `INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
			VALUES ('py_1', 'refund:re_1', -300, 'usd', 'evt_old'), ('re_2', 'refund:re_2', -50, 'usd', 'evt_old')`)
		w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
		paid := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
		paid["charge"] = "py_1"
		b.receive(t, stripetest.Event("evt_p", "invoice.paid", paid))
		b.run(t, w)
		require.Equal(t, []string{"in_1 payment 1000", "in_1 refund:re_1 -300", "re_2 refund:re_2 -50"}, b.ledger(t))
		b.receive(t, stripetest.Event("evt_f", "refund.failed", stripetest.RefundIn("re_1", "py_1", "failed", 300)))
		b.receive(t, stripetest.Event("evt_f2", "refund.failed", stripetest.RefundIn("re_2", "", "failed", 50)))
		b.run(t, w)
		require.Equal(t, []string{"in_1 payment 1000", "in_1 refund:re_1 -300", "in_1 refund_reversal:re_1 300",
			"re_2 refund:re_2 -50", "re_2 refund_reversal:re_2 50"}, b.ledger(t))
	})

	// A link moves the refunds the refunds table names the payment in, even
	// when the payment's link row does not say it has refunds (here the
	// backfill's marks are gone).
	t.Run("a refund whose charge's link row is not marked", func(t *testing.T) {
		t.Parallel()
		b := upgradedWith(t, `INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
			VALUES ('ch_1', 'refund:re_1', -300, 'usd', 'evt_old')`)
		_, err := b.pool.Exec(context.Background(), "DELETE FROM payment_links")
		require.NoError(t, err)
		w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
		paid := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
		paid["charge"] = "ch_1"
		b.receive(t, stripetest.Event("evt_p", "invoice.paid", paid))
		b.run(t, w)
		require.Equal(t, []string{"in_1 payment 1000", "in_1 refund:re_1 -300"}, b.ledger(t))
	})

	pi := func(r map[string]any) map[string]any { r["payment_intent"] = "pi_1"; return r }
	invoicePayment := map[string]any{"id": "inpay_1", "object": "invoice_payment", "invoice": "in_1", "status": "paid",
		"payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_1"}}
	want := []string{"in_1 payment 1000", "in_1 refund:re_1 -300", "in_1 refund_reversal:re_1 300"}
	for name, events := range map[string][][]byte{
		// The refund's first event names only the charge (booked under it);
		// the invoice's link names only the PaymentIntent (nothing to move:
		// no refund names it yet); a later event of the refund names both:
		// it reveals the invoice, and moves the refund there with its
		// reversal.
		"charge only, then a PaymentIntent link, then an event naming both": {
			stripetest.Event("evt_1", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			stripetest.Event("evt_2", "invoice_payment.paid", invoicePayment),
			stripetest.Event("evt_3", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000)),
			stripetest.Event("evt_4", "refund.failed", pi(stripetest.RefundIn("re_1", "ch_1", "failed", 300)))},
		// The same, the event naming both first (no link known yet), then the
		// link: the link moves the refund by its PaymentIntent.
		"charge only, then both, then the PaymentIntent link": {
			stripetest.Event("evt_1", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			stripetest.Event("evt_4", "refund.failed", pi(stripetest.RefundIn("re_1", "ch_1", "failed", 300))),
			stripetest.Event("evt_2", "invoice_payment.paid", invoicePayment),
			stripetest.Event("evt_3", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000))},
		// Linked first; the failure names only the charge: its reversal goes
		// under the invoice the refund is already attributed to, not under
		// the charge.
		"both, then the link, then a failure naming only the charge": {
			stripetest.Event("evt_1", "refund.created", pi(stripetest.RefundIn("re_1", "ch_1", "succeeded", 300))),
			stripetest.Event("evt_2", "invoice_payment.paid", invoicePayment),
			stripetest.Event("evt_3", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 1000)),
			stripetest.Event("evt_4", "refund.failed", stripetest.RefundIn("re_1", "ch_1", "failed", 300))},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.applyOneByOne(t, events...)
			require.Equal(t, want, b.ledger(t))
			require.Equal(t, 1, b.db.Count(t, "refunds", "id = 're_1' AND invoice_id = 'in_1' AND booked_under = 'in_1'"))
		})
	}
}

// Point 3 under concurrency: a refund booked in one transaction and the
// charge -> invoice (or PaymentIntent -> invoice) link recorded in another,
// at the same time, end with the refund, and its reversal, under the invoice
// whichever commits first. Both take the link row, or the refund's row,
// before they book, so the second waits for the first and then sees what it
// did.
func TestConcurrentRefundAndLinkEndUnderTheInvoice(t *testing.T) {
	t.Parallel()
	paid := stripetest.Invoice("in_1", "cus_1", "paid", 1000)
	paid["charge"] = "ch_1"
	ev := func(id, typ string, object map[string]any) handlers.Event {
		return handlers.Event{ID: id, Type: typ, Payload: stripetest.Event(id, typ, object)}
	}
	pi := func(r map[string]any) map[string]any { r["payment_intent"] = "pi_1"; return r }
	invoicePayment := ev("evt_ip", "invoice_payment.paid", map[string]any{"id": "inpay_1", "object": "invoice_payment", "invoice": "in_1",
		"status": "paid", "payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_1"}})
	for name, tc := range map[string]struct {
		before       []handlers.Event // committed first
		refund, link handlers.Event   // then these two, concurrently
		want         []string
	}{
		"a charge's refund and the charge's link": {
			refund: ev("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			link:   ev("evt_p", "invoice.paid", paid),
			want:   []string{"in_1 payment 1000", "in_1 refund:re_1 -300"},
		},
		// Booked under the charge; the failure names the PaymentIntent the
		// link names: the refund and its reversal end together under the
		// invoice.
		"a failure naming the PaymentIntent and its link": {
			before: []handlers.Event{ev("evt_r", "refund.created", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300))},
			refund: ev("evt_f", "refund.failed", pi(stripetest.RefundIn("re_1", "ch_1", "failed", 300))),
			link:   invoicePayment,
			want:   []string{"in_1 refund:re_1 -300", "in_1 refund_reversal:re_1 300"},
		},
		// The refund row knows the PaymentIntent; the event that books it
		// names only the charge, while the link names only the PaymentIntent:
		// they meet on the refund's row.
		"a success naming only the charge and the PaymentIntent's link": {
			before: []handlers.Event{ev("evt_r", "refund.created", pi(stripetest.RefundIn("re_1", "ch_1", "pending", 300)))},
			refund: ev("evt_s", "refund.updated", stripetest.RefundIn("re_1", "ch_1", "succeeded", 300)),
			link:   invoicePayment,
			want:   []string{"in_1 refund:re_1 -300"},
		},
	} {
		for order, pair := range map[string][2]handlers.Event{"refund first": {tc.refund, tc.link}, "link first": {tc.link, tc.refund}} {
			t.Run(name+", "+order, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				b := setup(t)
				reg := handlers.Default()
				for _, e := range tc.before {
					tx, err := b.pool.Begin(ctx)
					require.NoError(t, err)
					_, err = reg.Apply(ctx, tx, e)
					require.NoError(t, err)
					require.NoError(t, tx.Commit(ctx))
				}
				txA, err := b.db.Connect(t).Begin(ctx)
				require.NoError(t, err)
				_, err = reg.Apply(ctx, txA, pair[0])
				require.NoError(t, err)
				connB := b.db.Connect(t)
				done := make(chan error, 1)
				go func() {
					txB, err := connB.Begin(ctx)
					if err == nil {
						if _, err = reg.Apply(ctx, txB, pair[1]); err == nil {
							err = txB.Commit(ctx)
						}
					}
					done <- err
				}()
				b.db.WaitForLockWaiter(t) // the second waits for a link row or the refund's row
				require.NoError(t, txA.Commit(ctx))
				require.NoError(t, <-done)
				require.Equal(t, tc.want, b.ledger(t))
			})
		}
	}
}

// countingDB counts a handler's statements.
type countingDB struct {
	handlers.DB
	n int
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n++
	return c.DB.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n++
	return c.DB.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n++
	return c.DB.QueryRow(ctx, sql, args...)
}

// invoice.paid stays one statement in the common cases, now that it also
// records the invoice's payment links and follows the newest snapshot: the
// invoice moves to paid (naming its charge or not), or it was already paid.
func TestInvoicePaidIsOneStatementInTheCommonCase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	withCharge := stripetest.Invoice("in_2", "cus_1", "paid", 100)
	withCharge["charge"] = "ch_2"
	for _, ev := range []handlers.Event{
		{ID: "evt_1", Type: "invoice.paid", Payload: stripetest.Event("evt_1", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 100))},
		{ID: "evt_1b", Type: "invoice.paid", Payload: stripetest.Event("evt_1b", "invoice.paid", stripetest.Invoice("in_1", "cus_1", "paid", 100))},
		{ID: "evt_2", Type: "invoice.paid", Payload: stripetest.Event("evt_2", "invoice.paid", withCharge)},
		{ID: "evt_2b", Type: "invoice.paid", Payload: stripetest.EventWith("evt_2b", "invoice.paid", stripetest.Meta{Created: 1}, withCharge)},
	} {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		db := &countingDB{DB: tx}
		_, err = handlers.Default().Apply(ctx, db, ev)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, db.n, ev.ID)
	}
	require.Equal(t, []string{"in_1 payment 100", "in_2 payment 100"}, b.ledger(t))
}

// applyOneByOne stores each event and runs a one-drainer worker after each,
// so they are processed in exactly this order.
func (b *testBundle) applyOneByOne(t *testing.T, events ...[]byte) {
	t.Helper()
	w := b.newWorker(t, nil, worker.Config{Concurrency: 1})
	for _, ev := range events {
		b.receive(t, ev)
		b.run(t, w)
	}
}
