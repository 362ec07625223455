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
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/worker"
)

func scale(ctx context.Context, out io.Writer) {
	history, pending := 1_000_000, 100_000
	if *quick {
		history, pending = 5_000, 1_000
	}
	fmt.Fprintf(out, "## 3. Scale: claim and drain with %d processed rows and %d backlog, against an empty table\n\n", history, pending)
	var t table
	for _, withHistory := range []bool{false, true} {
		exec0(ctx, "TRUNCATE webhook_inbox, invoices, ledger_entries, outbox, anomalies, refunds, payment_links")
		if withHistory {
			exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload, received_at, processed_at, outcome, attempts)
				SELECT 'stripe', 'billing', 'evt_h_' || g, 'invoice.paid', false, 'in_h_' || g, $1::jsonb,
				       now() - interval '40 days' + g * interval '1 second', now() - interval '40 days' + g * interval '1 second', 'applied', 1
				  FROM generate_series(1, $2) g`, string(samplePayload("evt_h")), history)
		}
		exec0(ctx, `INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, object_id, payload)
			SELECT 'stripe', 'billing', 'evt_q_' || g, 'invoice.paid', false, 'in_q_' || g,
			       jsonb_set($1::jsonb, '{data,object,id}', to_jsonb('in_q_' || g))
			  FROM generate_series(1, $2) g`, string(samplePayload("evt_q")), pending)
		exec0(ctx, "VACUUM ANALYZE webhook_inbox")

		// Claim latency: 200 default-sized claims on one connection.
		conn, err := pgx.Connect(ctx, *dbURL)
		check(err)
		var lat []time.Duration
		for range 200 {
			t0 := time.Now()
			_, err := inbox.Claim(ctx, conn, inbox.ClaimParams{MaxAttempts: 10, Limit: worker.DefaultClaimLimit, Lease: time.Hour})
			check(err)
			lat = append(lat, time.Since(t0))
		}
		conn.Close(ctx)
		slices.Sort(lat)
		exec0(ctx, "UPDATE webhook_inbox SET attempts = 0, available_at = now() WHERE processed_at IS NULL")

		// Drain the backlog with 4 drainers until 30 s before the deadline.
		ctxRun, cancel := context.WithTimeout(ctx, 60*time.Second)
		pool := openWorkerPool(ctx, 5)
		cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 4}.WithDefaults()
		w, err := worker.New(pool, handlers.Default(), cfg, quiet, nil)
		check(err)
		// Bound the run by deadline: ~ 30s of draining.
		start := time.Now()
		s, err := w.Run(ctxRun)
		cancel()
		pool.Close()
		check(err)
		rate := float64(s.Processed) / time.Since(start).Seconds()
		label := "empty table"
		if withHistory {
			label = fmt.Sprintf("%d processed rows", history)
		}
		t.add(label, ms(pct(lat, 50)), ms(pct(lat, 99)), f0(rate), strconv.Itoa(s.Processed))
		if withHistory {
			plan, err := benchsql.ExplainClaim(ctx, pool0(ctx), inbox.ClaimParams{MaxAttempts: worker.DefaultMaxAttempts, Limit: worker.DefaultClaimLimit, Lease: time.Hour}, "TEXT")
			check(err)
			fmt.Fprintf(out, "EXPLAIN (ANALYZE, BUFFERS) of the worker's claim (benchsql.ExplainClaim, rolled back) with the history present, after the drain:\n\n```\n%s\n```\n\n", plan)
		}
	}
	t.print(out, "table", "claim p50 ms", "claim p99 ms", "drain receipts/s (4 drainers, default batch, 30 s)", "processed")
}
