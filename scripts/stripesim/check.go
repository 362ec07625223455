package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The simulator's own reads. Every query is scoped to one run's ids (which
// all start with the run prefix), so runs can share a database.
const (
	// $1 endpoint, $2 event id prefix, $3 max attempts.
	countPending = `
SELECT count(*) FROM webhook_inbox
 WHERE provider = 'stripe' AND endpoint = $1 AND starts_with(event_id, $2)
   AND processed_at IS NULL AND attempts < $3`

	// $1 endpoint, $2 event id prefix.
	selectReceipts = `
SELECT event_id, processed_at IS NOT NULL, attempts FROM webhook_inbox
 WHERE provider = 'stripe' AND endpoint = $1 AND starts_with(event_id, $2)`

	// $1 invoice id prefix.
	selectInvoices = `SELECT id, status, amount_paid FROM invoices WHERE starts_with(id, $1)`

	// $1 invoice id prefix, $2 charge id prefix, $3 refund kind prefix.
	selectLedger = `
SELECT invoice_id, kind, amount FROM ledger_entries
 WHERE starts_with(invoice_id, $1) OR starts_with(invoice_id, $2) OR starts_with(kind, $3)`

	// $1 invoice id prefix.
	selectOutbox = `
SELECT aggregate_id, count(*) FROM outbox
 WHERE event_type = 'InvoicePaymentBooked' AND starts_with(aggregate_id, $1)
 GROUP BY aggregate_id`

	// $1 invoice id prefix, $2 charge id prefix.
	countAnomalies = `
SELECT count(*) FROM anomalies WHERE starts_with(subject_id, $1) OR starts_with(subject_id, $2)`
)

// result is what the check found.
type result struct {
	Receipts    int // receipt rows of this run
	ReceiptLost int // events answered 2xx without a receipt row
	Lost        int // expected effects missing (invoice, ledger entry, outbox row)
	Wrong       int // effects present with the wrong status or amount
	Doubled     int // ledger rows or outbox rows beyond the expected ones
	Unprocessed int // receipts with processed_at NULL
	NeedsReview int // unprocessed receipts at the attempt limit
	Reattempted int // processed receipts that took more than one attempt
	Anomalies   int // anomaly rows (none of the stories should raise one)
}

func (r result) failed() bool {
	return r.ReceiptLost+r.Lost+r.Wrong+r.Doubled+r.Unprocessed+r.Anomalies > 0
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

// waitDrained polls until no receipt of the run is left for the worker (or
// only ones at the attempt limit), or the timeout passes. It reports how long
// it waited and whether the backlog emptied.
func waitDrained(ctx context.Context, url, endpoint, run string, maxAttempts int, timeout time.Duration) (time.Duration, bool) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var n int
		conn, err := connect(ctx, url)
		if err == nil {
			err = conn.QueryRow(ctx, countPending, endpoint, "evt_"+run+"_", maxAttempts).Scan(&n)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil && n == 0 {
				return time.Since(start), true
			}
		}
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// check compares the database with exp and the set of acknowledged events.
func check(ctx context.Context, conn *pgx.Conn, endpoint, run string, maxAttempts int, exp expected, acked []string) (result, error) {
	var r result
	evtPrefix, invPrefix, chPrefix := "evt_"+run+"_", "in_"+run+"_", "ch_"+run+"_"

	receipts := map[string]bool{}
	rows, err := conn.Query(ctx, selectReceipts, endpoint, evtPrefix)
	if err != nil {
		return r, fmt.Errorf("reading receipts: %w", err)
	}
	for rows.Next() {
		var id string
		var processed bool
		var attempts int
		if err := rows.Scan(&id, &processed, &attempts); err != nil {
			return r, fmt.Errorf("reading receipts: %w", err)
		}
		receipts[id] = true
		if processed && attempts > 1 {
			r.Reattempted++
		}
		if !processed {
			r.Unprocessed++
			if attempts >= maxAttempts {
				r.NeedsReview++
			}
		}
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading receipts: %w", err)
	}
	r.Receipts = len(receipts)
	for _, id := range acked {
		if !receipts[id] {
			r.ReceiptLost++
		}
	}

	seen := map[string]bool{}
	rows, err = conn.Query(ctx, selectInvoices, invPrefix)
	if err != nil {
		return r, fmt.Errorf("reading invoices: %w", err)
	}
	for rows.Next() {
		var id, status string
		var paid int64
		if err := rows.Scan(&id, &status, &paid); err != nil {
			return r, fmt.Errorf("reading invoices: %w", err)
		}
		seen[id] = true
		want, ok := exp.Invoices[id]
		if !ok || want.Status != status || (status == "paid" && want.AmountPaid != paid) {
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

	// Ledger: one 'payment' per paid invoice, one 'refund:<id>' per refund
	// (booked against the invoice or the charge, depending on which event
	// got there first).
	type booking struct {
		count  int
		amount int64
	}
	ledger := map[string]*booking{}
	rows, err = conn.Query(ctx, selectLedger, invPrefix, chPrefix, "refund:re_"+run+"_")
	if err != nil {
		return r, fmt.Errorf("reading ledger: %w", err)
	}
	for rows.Next() {
		var subject, kind string
		var amount int64
		if err := rows.Scan(&subject, &kind, &amount); err != nil {
			return r, fmt.Errorf("reading ledger: %w", err)
		}
		key := kind
		if kind == "payment" {
			key = "payment:" + subject
		}
		b := ledger[key]
		if b == nil {
			b = &booking{}
			ledger[key] = b
		}
		b.count++
		b.amount = amount
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading ledger: %w", err)
	}
	want := map[string]int64{}
	for inv, amt := range exp.Payments {
		want["payment:"+inv] = amt
	}
	for re, amt := range exp.Refunds {
		want["refund:"+re] = amt
	}
	for key, amt := range want {
		b := ledger[key]
		switch {
		case b == nil:
			r.Lost++
		case b.amount != amt:
			r.Wrong++
		}
	}
	for key, b := range ledger {
		if _, ok := want[key]; !ok {
			r.Doubled += b.count
		} else if b.count > 1 {
			r.Doubled += b.count - 1
		}
	}

	// Outbox: exactly one InvoicePaymentBooked per paid invoice.
	outbox := map[string]int{}
	rows, err = conn.Query(ctx, selectOutbox, invPrefix)
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

	if err := conn.QueryRow(ctx, countAnomalies, invPrefix, chPrefix).Scan(&r.Anomalies); err != nil {
		return r, fmt.Errorf("counting anomalies: %w", err)
	}
	return r, nil
}
