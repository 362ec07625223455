package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
)

const (
	// $1 invoice id prefix: the run's outbox rows.
	selectRunOutbox = `SELECT id, aggregate_id, published_at IS NOT NULL FROM outbox WHERE starts_with(aggregate_id, $1)`
	// $1 invoice id prefix.
	countUnpublished = `SELECT count(*) FROM outbox WHERE starts_with(aggregate_id, $1) AND published_at IS NULL`
)

// relayed is what the relay check found: the run's outbox rows still
// unpublished, rows marked published that the stand-in never accepted
// (lost), and entries accepted more than once (duplicates: at least once).
type relayed struct {
	Rows, Unpublished, Lost, Duplicates int
}

// checkRelayed waits until every outbox row of the run is marked
// published (giving up only when the number unpublished has not shrunk for
// stall: a state, not a time), then compares the rows with what the EventBridge
// stand-in at ebURL accepted. Outbox ids restart in every scenario's
// database, so entries are matched on (outbox_id, aggregate_id), and the
// aggregate ids carry the run's prefix.
func checkRelayed(ctx context.Context, dbURL, ebURL, invPrefix string, stall time.Duration) (relayed, error) {
	var r relayed
	waitUntilNone(ctx, dbURL, stall, countUnpublished, invPrefix)

	cctx, cancel2 := context.WithTimeout(ctx, time.Minute)
	defer cancel2()
	conn, err := connect(cctx, dbURL)
	if err != nil {
		return r, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	type key struct {
		id  int64
		agg string
	}
	published := map[key]bool{}
	rows, err := conn.Query(cctx, selectRunOutbox, invPrefix)
	if err != nil {
		return r, fmt.Errorf("reading outbox: %w", err)
	}
	for rows.Next() {
		var k key
		var marked bool
		if err := rows.Scan(&k.id, &k.agg, &marked); err != nil {
			return r, fmt.Errorf("reading outbox: %w", err)
		}
		published[k] = marked
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading outbox: %w", err)
	}

	req, err := http.NewRequestWithContext(cctx, http.MethodGet, ebURL+eventbridgetest.PublishedPath, nil)
	if err != nil {
		return r, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return r, fmt.Errorf("reading the EventBridge stand-in: %w", err)
	}
	defer resp.Body.Close()
	var details []struct {
		OutboxID    int64  `json:"outbox_id"`
		AggregateID string `json:"aggregate_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&details); err != nil {
		return r, fmt.Errorf("reading the EventBridge stand-in: %w", err)
	}
	accepted := map[key]int{}
	for _, d := range details {
		k := key{d.OutboxID, d.AggregateID}
		if _, ours := published[k]; ours {
			accepted[k]++
		}
	}
	r.Rows = len(published)
	for k, marked := range published {
		switch {
		case !marked:
			r.Unpublished++
		case accepted[k] == 0:
			r.Lost++
		default:
			r.Duplicates += accepted[k] - 1
		}
	}
	return r, nil
}

// waitUntilNone polls count (a query of one count, with args) until it
// reads 0, or until the count has not shrunk for stall (a state, not a
// time: the drain still progresses while it shrinks), or ctx ends. Each
// look is bounded by stall: the database may be down (dbcrash).
func waitUntilNone(ctx context.Context, dbURL string, stall time.Duration, count string, args ...any) {
	best, progressed := -1, time.Now()
	for {
		var n int
		lctx, cancel := context.WithTimeout(ctx, stall)
		conn, err := connect(lctx, dbURL)
		if err == nil {
			err = conn.QueryRow(lctx, count, args...).Scan(&n)
			conn.Close(context.WithoutCancel(ctx))
		}
		cancel()
		if err == nil && n == 0 {
			return
		}
		if err == nil && (best < 0 || n < best) {
			best, progressed = n, time.Now()
		}
		if time.Since(progressed) > stall || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}
