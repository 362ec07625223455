package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stripe-inbox/inbox/internal/benchsql"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// needsReview measures the claim with many receipts waiting for review (an
// incident's worth) against the same claim with none: parked out of the
// claim's index range as the worker leaves them, and, for comparison, left
// in it as they were before (an old available_at at the front of
// webhook_inbox_unprocessed, skipped by the claim's filter one by one).
func needsReview(ctx context.Context, out io.Writer) {
	stuck, pending := 100_000, 20_000
	if *quick {
		stuck, pending = 1_000, 500
	}
	claims := pending / (2 * worker.DefaultClaimLimit) // half the backlog, so no claim comes back empty
	fmt.Fprintf(out, "## 6. Needs review: the claim with %d receipts waiting for review, against none\n\n", stuck)
	fmt.Fprintf(out, "%d claims of %d on one connection over a backlog of %d claimable receipts; ratios against the table without needs-review rows, in the same run.\n\n",
		claims, worker.DefaultClaimLimit, pending)
	var t table
	var base []time.Duration
	for _, variant := range []string{"none", "parked", "unparked"} {
		exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
		if variant != "none" {
			// Receipts that failed their last attempt during an incident an
			// hour ago: at the limit, with the available_at of their last
			// backoff.
			exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload, received_at, available_at, attempts, last_error)
				SELECT 'stripe', 'billing', 'evt_nr_' || g, 'invoice.paid', false, 'in_nr_' || g, $1::jsonb,
				       now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 millisecond', $3, 'pg 23502: boom'
				  FROM generate_series(1, $2) g`, string(samplePayload("evt_nr")), stuck, worker.DefaultMaxAttempts)
			if variant == "parked" {
				// What the worker does with rows that reached the limit
				// before claims and failures parked them.
				parked, err := inbox.ParkNeedsReview(ctx, pool0(ctx), worker.DefaultMaxAttempts, nil)
				check(err)
				if parked != stuck {
					fail(fmt.Errorf("parked %d of %d needs-review rows", parked, stuck))
				}
			}
		}
		exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
			SELECT 'stripe', 'billing', 'evt_nq_' || g, 'invoice.paid', false, 'in_nq_' || g, $1::jsonb
			  FROM generate_series(1, $2) g`, string(samplePayload("evt_nq")), pending)
		exec0(ctx, "VACUUM ANALYZE webhook_inbox")

		conn, err := pgx.Connect(ctx, *dbURL)
		check(err)
		p := inbox.ClaimParams{MaxAttempts: worker.DefaultMaxAttempts, Limit: worker.DefaultClaimLimit, Lease: time.Hour}
		plan, err := benchsql.ExplainClaim(ctx, conn, p, "TEXT")
		check(err)
		var lat []time.Duration
		for range claims {
			t0 := time.Now()
			claimed, err := inbox.Claim(ctx, conn, p)
			check(err)
			lat = append(lat, time.Since(t0))
			if len(claimed) != worker.DefaultClaimLimit {
				fail(fmt.Errorf("a claim took %d receipts, not %d", len(claimed), worker.DefaultClaimLimit))
			}
		}
		conn.Close(ctx)
		slices.Sort(lat)
		backlog, err := inbox.Stats(ctx, pool0(ctx), worker.DefaultMaxAttempts, nil)
		check(err)
		if variant == "none" {
			base = lat
		}
		label := map[string]string{
			"none":     "no needs-review rows",
			"parked":   fmt.Sprintf("%d needs-review rows, parked (this version)", stuck),
			"unparked": fmt.Sprintf("%d needs-review rows in the claim's range (before)", stuck),
		}[variant]
		t.add(label, ms(pct(lat, 50)), ms(pct(lat, 99)), ratio(pct(lat, 50).Seconds(), pct(base, 50).Seconds()),
			ratio(pct(lat, 99).Seconds(), pct(base, 99).Seconds()), strconv.Itoa(backlog.NeedsReview))
		if variant != "none" {
			fmt.Fprintf(out, "EXPLAIN (ANALYZE, BUFFERS) of the claim, %s:\n\n```\n%s\n```\n\n", label, plan)
		}
	}
	t.print(out, "table", "claim p50 ms", "claim p99 ms", "p50 / none", "p99 / none", "NeedsReview counted")
}
