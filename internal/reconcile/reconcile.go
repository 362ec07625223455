// Package reconcile repairs what Stripe never delivered: it lists the events
// of the types the handlers subscribe to on Stripe's Events API
// (GET /v1/events, which keeps 30 days) and stores each one as a receipt
// with the webhook's own INSERT … ON CONFLICT DO NOTHING (inbox.StoreFrom,
// source 'reconcile'), so that an event the webhook already stored is a
// duplicate and one it never got is stored and drained by the worker like
// any receipt.
//
// A run covers the window [high-water − overlap, now − settle] of one
// endpoint, cut in slices (oldest first) of at most Config.Slice. Each slice
// is listed newest first through every page (starting_after the last event
// of the previous page, until has_more is false: never stopping after one
// page), per group of at most 20 types; the endpoint's high-water mark moves
// to the slice's end only once all of its pages are stored. A page that
// fails (after the client's retries) ends the run with the mark at the last
// complete slice, and the next run lists from there again. Backfill lists an
// explicit window the same way and leaves the mark alone.
//
// Fetching and storing are apart (Lister, Sink) because in AWS they run in
// two functions: the fetcher outside the VPC (the Stripe API needs the
// internet, and there is no NAT gateway) hands each page to the store
// function inside it (StoreHandler, reached through RemoteSink).
package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/stripe-inbox/inbox/internal/metrics"
)

// Horizon is how far back the Events API lists events
// (https://docs.stripe.com/api/events: "going back up to 30 days").
const Horizon = 30 * 24 * time.Hour

// Defaults and limits of Config (internal/config checks the environment
// against them).
const (
	DefaultOverlap  = 10 * time.Minute
	DefaultSettle   = time.Minute
	MaxSettle       = 5 * time.Minute
	DefaultLookback = 3 * 24 * time.Hour
	MaxLookback     = Horizon
	DefaultSlice    = 6 * time.Hour
	DefaultMargin   = 20 * time.Second
)

// Config is one endpoint's reconciliation.
type Config struct {
	// Endpoint is the inbox endpoint the events are stored for (the
	// webhook endpoint whose deliveries are being repaired).
	Endpoint string
	// Types are the event types listed: the handlers' (handlers.Default).
	Types []string
	// Overlap re-lists this much before the high-water mark (events that
	// reached the list late).
	Overlap time.Duration
	// Settle keeps the window's end this far behind now, so that the
	// webhook's normal deliveries are not counted as missing (at most
	// MaxSettle).
	Settle time.Duration
	// Lookback is the first window's reach when the endpoint has no
	// high-water mark yet (at most MaxLookback).
	Lookback time.Duration
	// Slice bounds the part of a window listed before the mark advances.
	Slice time.Duration
	// DeadlineMargin: no new slice starts when the context's deadline is
	// nearer than this (a Lambda invocation's end).
	DeadlineMargin time.Duration
	// PageLimit is the page size asked for (1–100; default 100).
	PageLimit int
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Overlap == 0 {
		c.Overlap = DefaultOverlap
	}
	if c.Settle == 0 {
		c.Settle = DefaultSettle
	}
	if c.Lookback == 0 {
		c.Lookback = DefaultLookback
	}
	if c.Slice == 0 {
		c.Slice = DefaultSlice
	}
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = DefaultMargin
	}
	if c.PageLimit == 0 {
		c.PageLimit = PageLimit
	}
	return c
}

// Validate reports every mistake, phrased as what to fix, with the
// variable names functions/reconcile reads. It is the one place where these
// ranges are checked (internal/config only parses them).
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Endpoint == "" {
		add("RECONCILE_ENDPOINT: no endpoint to store the events for")
	}
	if len(c.Types) == 0 {
		add("no event types to list")
	}
	if c.Overlap < 0 || c.Overlap > 24*time.Hour {
		add("RECONCILE_OVERLAP=%s: must be from 0 to 24h", c.Overlap)
	}
	if c.Settle < 0 || c.Settle > MaxSettle {
		add("RECONCILE_SETTLE=%s: must be from 0 to %s", c.Settle, MaxSettle)
	}
	if c.Lookback < time.Minute || c.Lookback > MaxLookback {
		add("RECONCILE_LOOKBACK=%s: must be from 1m to 30d (%s; Stripe lists events of the last 30 days)", c.Lookback, MaxLookback)
	}
	if c.Slice < time.Minute || c.Slice > Horizon {
		add("RECONCILE_SLICE=%s: must be from 1m to 30d", c.Slice)
	}
	if c.PageLimit < 1 || c.PageLimit > PageLimit {
		add("RECONCILE_PAGE_LIMIT=%d: must be from 1 to %d", c.PageLimit, PageLimit)
	}
	if c.DeadlineMargin < time.Second || c.DeadlineMargin > 10*time.Minute {
		add("DEADLINE_MARGIN=%s: must be from 1s to 10m", c.DeadlineMargin)
	}
	return errors.Join(errs...)
}

// Counts is what storing one page did.
type Counts struct {
	// Stored: new receipts (events the webhook had not stored: missing).
	Stored int `json:"stored"`
	// AlreadyPresent: events the inbox already had (delivered by the
	// webhook, or stored by an earlier run).
	AlreadyPresent int `json:"already_present"`
	// MissingByType counts Stored by event type.
	MissingByType map[string]int `json:"missing_by_type,omitempty"`
}

// Add adds o's counts to c.
func (c *Counts) Add(o Counts) { c.add(o) }

func (c *Counts) add(o Counts) {
	c.Stored += o.Stored
	c.AlreadyPresent += o.AlreadyPresent
	for t, n := range o.MissingByType {
		if c.MissingByType == nil {
			c.MissingByType = map[string]int{}
		}
		c.MissingByType[t] += n
	}
}

// Sink stores pages and keeps the high-water mark: the database directly
// (DBSink) or the store function (RemoteSink).
type Sink interface {
	HighWater(ctx context.Context, endpoint string) (time.Time, bool, error)
	StorePage(ctx context.Context, endpoint string, events []json.RawMessage) (Counts, error)
	Advance(ctx context.Context, endpoint string, to time.Time) error
}

// Summary is what a run did.
type Summary struct {
	Since  time.Time `json:"since"` // the window listed: [Since, Until)
	Until  time.Time `json:"until"`
	Pages  int       `json:"pages"`
	Events int       `json:"events"`
	Counts
	// HighWater is the mark after the run (zero for a backfill).
	HighWater time.Time `json:"high_water,omitzero"`
	// Complete is false when the run stopped before the window's end (the
	// deadline margin); the next run continues from the mark.
	Complete bool `json:"complete"`
	// Clamped is true when the window was cut at the 30-day horizon:
	// events older than that can no longer be listed.
	Clamped bool `json:"clamped,omitempty"`
}

// Progress is reported after each page.
type Progress struct {
	Slice          [2]time.Time
	Pages          int
	Stored         int
	AlreadyPresent int
}

// Reconciler runs reconciliations.
type Reconciler struct {
	lister  Lister
	sink    Sink
	cfg     Config
	logger  *slog.Logger
	metrics *metrics.Emitter // may be nil
	// Now is the clock (tests set it).
	Now func() time.Time
	// OnPage, when set, is called after each stored page (the backfill's
	// progress line).
	OnPage func(Progress)
}

// New builds a Reconciler, as worker.New does: it validates cfg and returns
// an error saying what to fix. cfg takes no defaults here (call WithDefaults
// first): a zero RECONCILE_OVERLAP or RECONCILE_SETTLE is a valid choice.
// logger may be nil (discard), and em too (no metrics).
func New(sink Sink, lister Lister, cfg Config, logger *slog.Logger, em *metrics.Emitter) (*Reconciler, error) {
	errs := []error{cfg.Validate()}
	if sink == nil {
		errs = append(errs, errors.New("no sink to store the events in"))
	}
	if lister == nil {
		errs = append(errs, errors.New("no Events API client"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid reconcile configuration: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{lister: lister, sink: sink, cfg: cfg, logger: logger, metrics: em, Now: time.Now}, nil
}

// Run reconciles the window from the endpoint's high-water mark (less the
// overlap; the lookback when there is none) to now − settle, advancing the
// mark after each complete slice.
func (r *Reconciler) Run(ctx context.Context) (Summary, error) {
	now := r.Now()
	until := now.Add(-r.cfg.Settle).Truncate(time.Second)
	hw, ok, err := r.sink.HighWater(ctx, r.cfg.Endpoint)
	if err != nil {
		r.emit(Summary{}, err) // every run reports, failed or not
		return Summary{}, err
	}
	since := now.Add(-r.cfg.Lookback)
	if ok {
		since = hw.Add(-r.cfg.Overlap)
	}
	s, err := r.window(ctx, since, until, r.cfg.Types, true)
	if ok && s.HighWater.IsZero() {
		s.HighWater = hw
	}
	r.emit(s, err)
	return s, err
}

// Backfill lists [since, until) for types (the configured ones when empty)
// and stores what is missing. The high-water mark is left alone.
func (r *Reconciler) Backfill(ctx context.Context, since, until time.Time, types []string) (Summary, error) {
	if len(types) == 0 {
		types = r.cfg.Types
	}
	for _, t := range types {
		if !slices.Contains(r.cfg.Types, t) {
			return Summary{}, fmt.Errorf("backfill: type %q has no handler; the types are %v", t, r.cfg.Types)
		}
	}
	if !since.Before(until) {
		return Summary{}, fmt.Errorf("backfill: since %s is not before until %s", since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
	}
	s, err := r.window(ctx, since, until, types, false)
	r.emit(s, err)
	return s, err
}

func (r *Reconciler) window(ctx context.Context, since, until time.Time, types []string, advance bool) (Summary, error) {
	since = since.Truncate(time.Second)
	until = until.Truncate(time.Second)
	s := Summary{Since: since, Until: until}
	// A minute inside the horizon, so that the oldest slice is still
	// listable when its request is sent.
	if horizon := r.Now().Add(-Horizon + time.Minute).Truncate(time.Second); since.Before(horizon) {
		r.logger.Warn("window starts beyond the Events API's 30 days; events older than that cannot be reconciled",
			"endpoint", r.cfg.Endpoint, "since", since, "horizon", horizon)
		since, s.Since, s.Clamped = horizon, horizon, true
	}
	if !since.Before(until) {
		s.Complete = true
		return s, nil
	}
	groups := chunk(types, MaxTypesPerRequest)
	for from := since; from.Before(until); {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < r.cfg.DeadlineMargin {
			r.logger.Info("deadline near: the rest of the window is left to the next run", "endpoint", r.cfg.Endpoint, "from", from)
			return s, nil
		}
		to := from.Add(r.cfg.Slice)
		if to.After(until) {
			to = until
		}
		for _, g := range groups {
			if err := r.slice(ctx, &s, from, to, g); err != nil {
				return s, fmt.Errorf("reconciling %s, events created in [%s, %s): %w", r.cfg.Endpoint,
					from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), err)
			}
		}
		if advance {
			if err := r.sink.Advance(ctx, r.cfg.Endpoint, to); err != nil {
				return s, err
			}
			s.HighWater = to
		}
		from = to
	}
	s.Complete = true
	return s, nil
}

// slice lists every page of [from, to) for types, newest first, and stores
// each page before asking for the next.
func (r *Reconciler) slice(ctx context.Context, s *Summary, from, to time.Time, types []string) error {
	q := Query{Types: types, Since: from, Until: to, Limit: r.cfg.PageLimit}
	seen := map[string]bool{}
	for {
		page, err := r.lister.ListPage(ctx, q)
		if err != nil {
			return err
		}
		s.Pages++
		if len(page.Events) > 0 {
			last, err := eventID(page.Events[len(page.Events)-1])
			if err != nil {
				return err
			}
			if seen[last] {
				return fmt.Errorf("the list returned event %s twice: pagination does not advance", last)
			}
			seen[last] = true
			c, err := r.sink.StorePage(ctx, r.cfg.Endpoint, page.Events)
			if err != nil {
				return err
			}
			s.Events += len(page.Events)
			s.add(c)
			q.StartingAfter = last
		}
		if r.OnPage != nil {
			r.OnPage(Progress{Slice: [2]time.Time{from, to}, Pages: s.Pages, Stored: s.Stored, AlreadyPresent: s.AlreadyPresent})
		}
		if !page.HasMore {
			return nil
		}
		if len(page.Events) == 0 {
			return errors.New("the list says it has more but returned an empty page")
		}
	}
}

func eventID(raw json.RawMessage) (string, error) {
	var e struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.ID == "" {
		return "", fmt.Errorf("a listed event without id: %.100s", raw)
	}
	return e.ID, nil
}

func chunk(types []string, n int) [][]string {
	types = slices.Clone(types)
	slices.Sort(types)
	types = slices.Compact(types)
	var out [][]string
	for len(types) > n {
		out = append(out, types[:n])
		types = types[n:]
	}
	return append(out, types)
}

// emit writes the run's metrics: the totals, EventsFoundMissing (alarmed),
// and one EventsFoundMissing per type with an EventType dimension (the
// dashboard and the operator's "which types").
func (r *Reconciler) emit(s Summary, err error) {
	if r.metrics == nil {
		return
	}
	failed := 0.0
	if err != nil {
		failed = 1
	}
	_ = r.metrics.Emit(nil,
		metrics.Metric{Name: "ReconcilePages", Value: float64(s.Pages), Unit: metrics.Count},
		metrics.Metric{Name: "ReconcileEvents", Value: float64(s.Events), Unit: metrics.Count},
		metrics.Metric{Name: "ReconcileAlreadyPresent", Value: float64(s.AlreadyPresent), Unit: metrics.Count},
		metrics.Metric{Name: "EventsFoundMissing", Value: float64(s.Stored), Unit: metrics.Count},
		metrics.Metric{Name: "ReconcileFailed", Value: failed, Unit: metrics.Count},
	)
	for _, t := range slices.Sorted(maps.Keys(s.MissingByType)) {
		_ = r.metrics.Emit(map[string]string{"EventType": t},
			metrics.Metric{Name: "EventsFoundMissing", Value: float64(s.MissingByType[t]), Unit: metrics.Count})
	}
	if s.Stored > 0 {
		r.logger.Warn("events found missing: stored by the reconciler, never delivered by the webhook",
			"endpoint", r.cfg.Endpoint, "count", s.Stored, "by_type", s.MissingByType)
	}
}

// Invocation is the reconciler function's input: an EventBridge scheduled
// event (none of these fields: a continuous run), or a backfill window from
// cmd/reconcile --stage.
type Invocation struct {
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	Types []string   `json:"types,omitempty"`
}

// Invoke runs what in asks for: Backfill when it has a window, else Run.
func (r *Reconciler) Invoke(ctx context.Context, in Invocation) (Summary, error) {
	switch {
	case in.Since == nil && in.Until == nil && len(in.Types) == 0:
		return r.Run(ctx)
	case in.Since == nil || in.Until == nil:
		return Summary{}, errors.New("a backfill needs both since and until")
	}
	return r.Backfill(ctx, *in.Since, *in.Until, in.Types)
}
