package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The simulator's own reads, one table each. Every query is scoped to one
// run's ids (which all carry the run prefix), so runs can share a database.
const (
	// $1 endpoint, $2 event id prefix, $3 max attempts.
	countPending = `
SELECT count(*) FROM webhook_inbox
 WHERE provider = 'stripe' AND endpoint = $1 AND starts_with(event_id, $2)
   AND processed_at IS NULL AND attempts < $3`

	// $1 endpoint, $2 event id prefix.
	selectReceipts = `
SELECT event_id, processed_at IS NOT NULL, attempts, coalesce(outcome, ''), source = 'eventbridge' FROM webhook_inbox
 WHERE provider = 'stripe' AND endpoint = $1 AND starts_with(event_id, $2)`

	// $1 invoice id prefix.
	selectInvoices = `SELECT id, status, amount_due, amount_paid FROM invoices WHERE starts_with(id, $1)`

	// $1 the run's id prefixes (in_, ch_, pi_, re_), $2 the refund kinds'
	// prefixes. A refund's entries are under its invoice once any event has
	// named it, before that under its charge, PaymentIntent or own id.
	selectLedger = `
SELECT invoice_id, kind, amount FROM ledger_entries
 WHERE invoice_id ^@ ANY ($1::text[]) OR kind ^@ ANY ($2::text[])`

	// $1 invoice id prefix.
	selectOutbox = `
SELECT aggregate_id, count(*) FROM outbox
 WHERE event_type = 'InvoicePaymentBooked' AND starts_with(aggregate_id, $1)
 GROUP BY aggregate_id`

	// $1 the run's id prefixes.
	countAnomalies = `SELECT count(*) FROM anomalies WHERE subject_id ^@ ANY ($1::text[])`
)

// receiptsResult is the check of webhook_inbox.
type receiptsResult struct {
	Rows        int // receipt rows of this run
	Lost        int // events answered 2xx without a receipt row
	Unprocessed int // receipts with processed_at NULL
	NeedsReview int // unprocessed receipts at the attempt limit
	Reattempted int // processed receipts that took more than one attempt
	Wrong       int // other-mode receipts not marked ignored_other_mode, or booked-mode ones that were
	EventBridge int // receipts stored from an EventBridge delivery (source 'eventbridge'; the rest came signed)
}

// invoicesResult is the check of invoices.
type invoicesResult struct {
	Lost  int // expected invoices missing
	Wrong int // wrong status, amount_due or amount_paid, or an invoice no event of the booked mode names
}

// ledgerResult is the check of ledger_entries.
type ledgerResult struct {
	Lost    int // expected entries missing (including one booked under another key)
	Wrong   int // entries with the wrong amount
	Doubled int // entries beyond the expected ones (including one booked under another key)
}

// outboxResult is the check of the outbox.
type outboxResult struct {
	Lost    int // paid invoices without their InvoicePaymentBooked row
	Doubled int // rows beyond one per paid invoice
}

// result is what the check found, table by table.
type result struct {
	Receipts  receiptsResult
	Invoices  invoicesResult
	Ledger    ledgerResult
	Outbox    outboxResult
	Anomalies int // anomaly rows (none of the stories should raise one)
}

func (r result) lost() int    { return r.Invoices.Lost + r.Ledger.Lost + r.Outbox.Lost }
func (r result) wrong() int   { return r.Receipts.Wrong + r.Invoices.Wrong + r.Ledger.Wrong }
func (r result) doubled() int { return r.Ledger.Doubled + r.Outbox.Doubled }

func (r result) failed() bool {
	return r.Receipts.Lost+r.Receipts.Unprocessed+r.lost()+r.wrong()+r.doubled()+r.Anomalies > 0
}

// tables describes each table's check in one line.
func (r result) tables() []string {
	return []string{
		fmt.Sprintf("receipts: rows=%d lost=%d unprocessed=%d needs_review=%d reattempted=%d wrong=%d",
			r.Receipts.Rows, r.Receipts.Lost, r.Receipts.Unprocessed, r.Receipts.NeedsReview, r.Receipts.Reattempted, r.Receipts.Wrong),
		fmt.Sprintf("invoices: lost=%d wrong=%d", r.Invoices.Lost, r.Invoices.Wrong),
		fmt.Sprintf("ledger: lost=%d wrong=%d doubled=%d", r.Ledger.Lost, r.Ledger.Wrong, r.Ledger.Doubled),
		fmt.Sprintf("outbox: lost=%d doubled=%d", r.Outbox.Lost, r.Outbox.Doubled),
		fmt.Sprintf("anomalies: rows=%d", r.Anomalies),
	}
}

// perTable is the per-table part of the figures line.
func (r result) perTable() string {
	return fmt.Sprintf("receipts_wrong=%d invoices_lost=%d invoices_wrong=%d ledger_lost=%d ledger_wrong=%d ledger_doubled=%d outbox_lost=%d outbox_doubled=%d",
		r.Receipts.Wrong, r.Invoices.Lost, r.Invoices.Wrong, r.Ledger.Lost, r.Ledger.Wrong, r.Ledger.Doubled, r.Outbox.Lost, r.Outbox.Doubled)
}

// connect retries until the database answers or ctx ends: the check may
// start while the database is still recovering from a crash.
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to -db: %w", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitDrained waits until the run's receipts are all processed (or wait
// for review), and says whether they were. It waits for a state, not for a
// time: it gives up only when the backlog has not shrunk for stall (a worker
// that stopped, a receipt that can never be processed), however long the
// whole drain takes, so a busy or slow machine drains more slowly and still
// passes.
func waitDrained(ctx context.Context, url, endpoint, run string, maxAttempts int, stall time.Duration) (time.Duration, bool) {
	start := time.Now()
	best, progressed := -1, time.Now()
	for {
		var n int
		// Each look is bounded by stall: the database may be down (dbcrash).
		lctx, cancel := context.WithTimeout(ctx, stall)
		conn, err := connect(lctx, url)
		if err == nil {
			err = conn.QueryRow(lctx, countPending, endpoint, "evt_"+run+"_", maxAttempts).Scan(&n)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil && n == 0 {
				cancel()
				return time.Since(start), true
			}
			if err == nil && (best < 0 || n < best) {
				best, progressed = n, time.Now()
			}
		}
		cancel()
		if time.Since(progressed) > stall {
			return time.Since(start), false
		}
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// check compares each table with exp and the set of acknowledged events.
func check(ctx context.Context, conn *pgx.Conn, endpoint, run string, maxAttempts int, exp stripetest.Expected, acked []string) (result, error) {
	var r result
	var err error
	ids := []string{"in_" + run + "_", "ch_" + run + "_", "pi_" + run + "_", "re_" + run + "_"}
	if r.Receipts, err = checkReceipts(ctx, conn, endpoint, "evt_"+run+"_", maxAttempts, exp, acked); err != nil {
		return r, err
	}
	if r.Invoices, err = checkInvoices(ctx, conn, ids[0], exp); err != nil {
		return r, err
	}
	if r.Ledger, err = checkLedger(ctx, conn, ids, []string{"refund:re_" + run + "_", "refund_reversal:re_" + run + "_"}, exp); err != nil {
		return r, err
	}
	if r.Outbox, err = checkOutbox(ctx, conn, ids[0], exp); err != nil {
		return r, err
	}
	if err := conn.QueryRow(ctx, countAnomalies, ids).Scan(&r.Anomalies); err != nil {
		return r, fmt.Errorf("counting anomalies: %w", err)
	}
	return r, nil
}

// checkReceipts: every 2xx'd event has a receipt; every receipt is
// processed, the other mode's as ignored_other_mode and no other.
func checkReceipts(ctx context.Context, conn *pgx.Conn, endpoint, prefix string, maxAttempts int, exp stripetest.Expected, acked []string) (receiptsResult, error) {
	var r receiptsResult
	other := map[string]bool{}
	for _, id := range exp.OtherMode {
		other[id] = true
	}
	receipts := map[string]bool{}
	rows, err := conn.Query(ctx, selectReceipts, endpoint, prefix)
	if err != nil {
		return r, fmt.Errorf("reading receipts: %w", err)
	}
	for rows.Next() {
		var id, outcome string
		var processed, eb bool
		var attempts int
		if err := rows.Scan(&id, &processed, &attempts, &outcome, &eb); err != nil {
			return r, fmt.Errorf("reading receipts: %w", err)
		}
		receipts[id] = true
		if eb {
			r.EventBridge++
		}
		if processed && attempts > 1 {
			r.Reattempted++
		}
		if !processed {
			r.Unprocessed++
			if attempts >= maxAttempts {
				r.NeedsReview++
			}
		} else if other[id] != (outcome == "ignored_other_mode") {
			r.Wrong++
		}
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading receipts: %w", err)
	}
	r.Rows = len(receipts)
	for _, id := range acked {
		if !receipts[id] {
			r.Lost++
		}
	}
	return r, nil
}

// checkInvoices: exactly the expected invoices, each with its final status,
// the newest snapshot's amount_due and, when paid, the payment.
func checkInvoices(ctx context.Context, conn *pgx.Conn, prefix string, exp stripetest.Expected) (invoicesResult, error) {
	var r invoicesResult
	seen := map[string]bool{}
	rows, err := conn.Query(ctx, selectInvoices, prefix)
	if err != nil {
		return r, fmt.Errorf("reading invoices: %w", err)
	}
	for rows.Next() {
		var id string
		var got stripetest.InvoiceState
		if err := rows.Scan(&id, &got.Status, &got.AmountDue, &got.AmountPaid); err != nil {
			return r, fmt.Errorf("reading invoices: %w", err)
		}
		seen[id] = true
		if want, ok := exp.Invoices[id]; !ok || want != got {
			r.Wrong++
		}
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading invoices: %w", err)
	}
	for id := range exp.Invoices {
		if !seen[id] {
			r.Lost++
		}
	}
	return r, nil
}

// checkLedger: exactly the expected entries, by their unique key (invoice,
// kind): a payment per paid invoice, a refund (and reversal) per refund
// that succeeded (and then failed), under the invoice.
func checkLedger(ctx context.Context, conn *pgx.Conn, ids, kinds []string, exp stripetest.Expected) (ledgerResult, error) {
	var r ledgerResult
	got := map[stripetest.LedgerKey]int64{}
	rows, err := conn.Query(ctx, selectLedger, ids, kinds)
	if err != nil {
		return r, fmt.Errorf("reading ledger: %w", err)
	}
	for rows.Next() {
		var k stripetest.LedgerKey
		var amount int64
		if err := rows.Scan(&k.Invoice, &k.Kind, &amount); err != nil {
			return r, fmt.Errorf("reading ledger: %w", err)
		}
		got[k] = amount
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading ledger: %w", err)
	}
	for k, want := range exp.Ledger {
		amount, ok := got[k]
		switch {
		case !ok:
			r.Lost++
		case amount != want:
			r.Wrong++
		}
	}
	for k := range got {
		if _, ok := exp.Ledger[k]; !ok {
			r.Doubled++
		}
	}
	return r, nil
}

// checkOutbox: exactly one InvoicePaymentBooked per paid invoice.
func checkOutbox(ctx context.Context, conn *pgx.Conn, prefix string, exp stripetest.Expected) (outboxResult, error) {
	var r outboxResult
	outbox := map[string]int{}
	rows, err := conn.Query(ctx, selectOutbox, prefix)
	if err != nil {
		return r, fmt.Errorf("reading outbox: %w", err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return r, fmt.Errorf("reading outbox: %w", err)
		}
		outbox[id] = n
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading outbox: %w", err)
	}
	for inv := range exp.Payments {
		if outbox[inv] == 0 {
			r.Lost++
		}
	}
	for inv, n := range outbox {
		if _, ok := exp.Payments[inv]; !ok {
			r.Doubled += n
		} else if n > 1 {
			r.Doubled += n - 1
		}
	}
	return r, nil
}
