// Package reconcile repairs what Stripe never delivered: it lists the events
// of the types the handlers subscribe to on Stripe's Events API
// (GET /v1/events, which keeps 30 days) and stores each one as a receipt
// with the webhook's own INSERT … ON CONFLICT DO NOTHING (inbox.StoreFrom,
// source 'reconcile'), so that an event the webhook already stored is a
// duplicate and one it never got is stored and drained by the worker like
// any receipt.
//
// A run covers the window [high-water − overlap, now − settle] of one
// endpoint and lists it oldest first, so that the endpoint's high-water mark
// (every event created before it is stored) can move after every stored
// page: a backlog of any size completes over as many runs as it takes, each
// ending at its deadline with the mark where it got to. The Events API lists
// newest first; ending_before=<event> gives the page of events just newer
// than it, so a run first finds the oldest page of the window (a probe:
// newest first over a span that halves while the list says it has more,
// from Config.Slice down to one second) and then pages toward now with
// ending_before the newest event stored (page). Types are listed in groups
// of at most 20, each group paged on its own, the mark the least of the
// groups' progress. The deadline is checked after each page. A page that
// fails (after the client's retries) ends the run with the mark at the last
// stored page, and the next run lists from there again. Backfill lists an
// explicit window the same way and leaves the mark alone.
//
// Settle: the window ends Config.Settle before now, so that Stripe's own
// retries deliver what a transient failure missed before the reconciler
// lists it; EventsFoundMissing counts only events older than that (a
// backfill may store younger ones: Summary.StoredUnsettled). An event the
// reconciler stores and the endpoint then delivers while it is unprocessed
// is replaced by the delivery (internal/inbox Store).
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
	DefaultOverlap = 10 * time.Minute
	// DefaultSettle: the window ends an hour before now. Stripe retries a
	// failed delivery "for up to three days with an exponential back off"
	// in live mode and "three times over a few hours" in sandboxes
	// (https://docs.stripe.com/webhooks/process-undelivered-events,
	// https://docs.stripe.com/webhooks#automatic-retries); it does not
	// publish the intervals. An exponential schedule spread over three days
	// makes its first retries within the first hour, so a transient failure
	// (a deploy, a cold start that timed out, a database failover) is
	// normally healed by Stripe's own retry before the reconciler lists the
	// event, and EventsFoundMissing counts real misses only; an event Stripe
	// never delivers is still booked within about 75 minutes (settle plus
	// the 15-minute schedule), not after Stripe gives up.
	DefaultSettle = time.Hour
	// MaxSettle: Stripe stops retrying after three days; waiting longer
	// only delays the repair.
	MaxSettle       = 72 * time.Hour
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
	// Settle keeps the window's end this far behind now, so that Stripe's
	// own retries deliver first and only real misses are counted as
	// missing (at most MaxSettle; see DefaultSettle).
	Settle time.Duration
	// Lookback is the first window's reach when the endpoint has no
	// high-water mark yet (at most MaxLookback).
	Lookback time.Duration
	// Slice is the widest span the probe for the oldest page of a window
	// lists at once (it halves while the list has more).
	Slice time.Duration
	// DeadlineMargin: no new page is asked for when the context's deadline
	// is nearer than this (a Lambda invocation's end).
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
		add("RECONCILE_SETTLE=%s: must be from 0 to %s (Stripe retries for up to three days)", c.Settle, MaxSettle)
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
	// Reached: every event of the window created before it is stored (the
	// mark a run moved to; where a backfill got to). Until when Complete.
	Reached time.Time `json:"reached,omitzero"`
	// StoredUnsettled: new receipts of events younger than the settle
	// window (a backfill that reaches into it): Stripe may still deliver
	// them, so they are not counted as missing (Stored, EventsFoundMissing).
	StoredUnsettled int `json:"stored_unsettled,omitempty"`
	// Complete is false when the run stopped before the window's end (the
	// deadline margin); the next run continues from the mark.
	Complete bool `json:"complete"`
	// Clamped is true when the window was cut at the 30-day horizon:
	// events older than that can no longer be listed.
	Clamped bool `json:"clamped,omitempty"`
}

// Progress is reported after each page.
type Progress struct {
	Reached        time.Time // see Summary.Reached
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
// overlap; the lookback when there is none) to now − settle, oldest first,
// advancing the mark after each stored page.
func (r *Reconciler) Run(ctx context.Context) (Summary, error) {
	now := r.Now()
	until := now.Add(-r.cfg.Settle).Truncate(time.Second)
	hw, ok, err := r.sink.HighWater(ctx, r.cfg.Endpoint)
	if err != nil {
		r.emit(Summary{}, err, false) // every run reports, failed or not
		return Summary{}, err
	}
	since := now.Add(-r.cfg.Lookback)
	if ok {
		since = hw.Add(-r.cfg.Overlap)
	}
	s, err := r.window(ctx, since, until, r.cfg.Types, true)
	if ok && s.HighWater.Before(hw) {
		s.HighWater = hw // the overlap before the mark does not move it back
	}
	r.emit(s, err, true)
	return s, err
}

// Backfill lists [since, until) for types (the configured ones when empty)
// and stores what is missing. The high-water mark is left alone. A backfill
// stopped by its deadline says how far it got (Summary.Reached).
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
	r.emit(s, err, false)
	return s, err
}

// group is the paging of one group of at most MaxTypesPerRequest types.
type group struct {
	types []string
	// from: every event of these types created in the window before it is
	// stored.
	from time.Time
	// cursor is the newest event stored, the next page's ending_before; ""
	// until the oldest page of the window is found (probe).
	cursor string
	// span is the probe's span (whole seconds).
	span time.Duration
	done bool
	seen map[string]bool // the cursors used: a list that does not advance is an error
}

func (r *Reconciler) window(ctx context.Context, since, until time.Time, types []string, advance bool) (Summary, error) {
	since = since.Truncate(time.Second)
	until = until.Truncate(time.Second)
	s := Summary{Since: since, Until: until}
	// A minute inside the horizon, so that the oldest page is still
	// listable when its request is sent.
	if horizon := r.Now().Add(-Horizon + time.Minute).Truncate(time.Second); since.Before(horizon) {
		r.logger.Warn("window starts beyond the Events API's 30 days; events older than that cannot be reconciled",
			"endpoint", r.cfg.Endpoint, "since", since, "horizon", horizon)
		since, s.Since, s.Clamped = horizon, horizon, true
	}
	s.Reached = since
	if !since.Before(until) {
		s.Complete, s.Reached = true, until
		return s, nil
	}
	settled := r.Now().Add(-r.cfg.Settle) // events created before it count as missing
	var groups []*group
	for _, g := range chunk(types, MaxTypesPerRequest) {
		groups = append(groups, &group{types: g, from: since, span: max(r.cfg.Slice.Truncate(time.Second), time.Second), seen: map[string]bool{}})
	}
	for {
		// The group furthest behind: the mark is the least of theirs.
		var g *group
		for _, x := range groups {
			if !x.done && (g == nil || x.from.Before(g.from)) {
				g = x
			}
		}
		if g == nil {
			s.Complete = true
			return s, nil
		}
		if dl, ok := ctx.Deadline(); ok && dl.Sub(r.Now()) < r.cfg.DeadlineMargin {
			r.logger.Info("deadline near: the rest of the window is left to the next run", "endpoint", r.cfg.Endpoint, "reached", s.Reached)
			return s, nil
		}
		if err := r.page(ctx, &s, g, until, settled); err != nil {
			return s, fmt.Errorf("reconciling %s, events created in [%s, %s) (every one before %s is stored): %w", r.cfg.Endpoint,
				since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339), s.Reached.UTC().Format(time.RFC3339), err)
		}
		reached := until
		for _, x := range groups {
			if !x.done && x.from.Before(reached) {
				reached = x.from
			}
		}
		if reached.After(s.Reached) {
			if advance {
				if err := r.sink.Advance(ctx, r.cfg.Endpoint, reached); err != nil {
					return s, err
				}
				s.HighWater = reached
			}
			s.Reached = reached
		}
		if r.OnPage != nil {
			r.OnPage(Progress{Reached: s.Reached, Pages: s.Pages, Stored: s.Stored, AlreadyPresent: s.AlreadyPresent})
		}
	}
}

// page asks for the group's next page and stores it. Until the group knows
// the oldest page of what is left of the window, it probes: [from, from +
// span) newest first; a probe the list says has more is narrowed (nothing is
// stored), a complete one is stored and its newest event becomes the
// cursor. From the cursor on, each page is the events just newer than it
// (ending_before), newest first within the page: stored, its newest event
// is the next cursor, and every event created before that event's second is
// stored.
func (r *Reconciler) page(ctx context.Context, s *Summary, g *group, until, settled time.Time) error {
	if g.cursor == "" {
		to := g.from.Add(g.span)
		if to.After(until) {
			to = until
		}
		p, err := r.lister.ListPage(ctx, Query{Types: g.types, Since: g.from, Until: to, Limit: r.cfg.PageLimit})
		if err != nil {
			return err
		}
		s.Pages++
		switch {
		case p.HasMore && to.Sub(g.from) > time.Second:
			g.span = max((to.Sub(g.from) / 2).Truncate(time.Second), time.Second)
			return nil
		case p.HasMore:
			// One second holds more than a page: list it to its end,
			// newest first, before the mark may pass it.
			return r.second(ctx, s, g, p, to, until, settled)
		}
		if err := r.store(ctx, s, p.Events, settled); err != nil {
			return err
		}
		if len(p.Events) > 0 {
			head, err := eventHead(p.Events[0])
			if err != nil {
				return err
			}
			g.cursor = head.ID
			g.seen[head.ID] = true
		} else {
			g.span *= 2 // nothing there: look further at once
		}
		g.from, g.done = to, !to.Before(until)
		return nil
	}
	p, err := r.lister.ListPage(ctx, Query{Types: g.types, Since: g.from, Until: until, EndingBefore: g.cursor, Limit: r.cfg.PageLimit})
	if err != nil {
		return err
	}
	s.Pages++
	if len(p.Events) == 0 {
		if p.HasMore {
			return errors.New("the list says it has more but returned an empty page")
		}
		g.from, g.done = until, true
		return nil
	}
	newest, err := eventHead(p.Events[0])
	if err != nil {
		return err
	}
	if g.seen[newest.ID] {
		return fmt.Errorf("the list returned event %s twice: pagination does not advance", newest.ID)
	}
	g.seen[newest.ID] = true
	if err := r.store(ctx, s, p.Events, settled); err != nil {
		return err
	}
	g.cursor = newest.ID
	if !p.HasMore {
		g.from, g.done = until, true
		return nil
	}
	if at := time.Unix(newest.Created, 0); at.After(g.from) {
		g.from = at
	}
	return nil
}

// second lists the one second [g.from, to) whose first page (newest first)
// is first and has more, to its end with starting_after, storing each page;
// then the group goes on after it, its cursor the second's newest event.
func (r *Reconciler) second(ctx context.Context, s *Summary, g *group, first Page, to, until, settled time.Time) error {
	if len(first.Events) == 0 {
		return errors.New("the list says it has more but returned an empty page")
	}
	newest, err := eventHead(first.Events[0])
	if err != nil {
		return err
	}
	p := first
	for {
		if err := r.store(ctx, s, p.Events, settled); err != nil {
			return err
		}
		if !p.HasMore {
			break
		}
		last, err := eventHead(p.Events[len(p.Events)-1])
		if err != nil {
			return err
		}
		if g.seen[last.ID] {
			return fmt.Errorf("the list returned event %s twice: pagination does not advance", last.ID)
		}
		g.seen[last.ID] = true
		if p, err = r.lister.ListPage(ctx, Query{Types: g.types, Since: g.from, Until: to, StartingAfter: last.ID, Limit: r.cfg.PageLimit}); err != nil {
			return err
		}
		s.Pages++
		if len(p.Events) == 0 && p.HasMore {
			return errors.New("the list says it has more but returned an empty page")
		}
	}
	g.cursor, g.from, g.done = newest.ID, to, !to.Before(until)
	g.seen[newest.ID] = true
	return nil
}

// store hands a page to the sink. Events younger than settled (a backfill
// that reaches into the settle window) are stored apart and counted in
// StoredUnsettled, not as missing: Stripe may still deliver them.
func (r *Reconciler) store(ctx context.Context, s *Summary, events []json.RawMessage, settled time.Time) error {
	young := 0 // newest first: the young ones lead
	for _, raw := range events {
		h, err := eventHead(raw)
		if err != nil {
			return err
		}
		if h.Created < settled.Unix() {
			break
		}
		young++
	}
	if young > 0 {
		c, err := r.sink.StorePage(ctx, r.cfg.Endpoint, events[:young])
		if err != nil {
			return err
		}
		s.StoredUnsettled += c.Stored
		s.AlreadyPresent += c.AlreadyPresent
	}
	if young < len(events) {
		c, err := r.sink.StorePage(ctx, r.cfg.Endpoint, events[young:])
		if err != nil {
			return err
		}
		s.add(c)
	}
	s.Events += len(events)
	return nil
}

// head is what the reconciler reads of a listed event.
type head struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
}

func eventHead(raw json.RawMessage) (head, error) {
	var h head
	if err := json.Unmarshal(raw, &h); err != nil || h.ID == "" || h.Created <= 0 {
		return head{}, fmt.Errorf("a listed event without id or created: %.100s", raw)
	}
	return h, nil
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
// dashboard and the operator's "which types"). A scheduled run (run) also
// reports how old the mark is and whether the window was cut at the Events
// API's 30 days (ReconcileWindowClamped, alarmed: events in the gap can no
// longer be listed).
func (r *Reconciler) emit(s Summary, err error, run bool) {
	if r.metrics == nil {
		return
	}
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ms := []metrics.Metric{
		{Name: "ReconcilePages", Value: float64(s.Pages), Unit: metrics.Count},
		{Name: "ReconcileEvents", Value: float64(s.Events), Unit: metrics.Count},
		{Name: "ReconcileAlreadyPresent", Value: float64(s.AlreadyPresent), Unit: metrics.Count},
		{Name: "EventsFoundMissing", Value: float64(s.Stored), Unit: metrics.Count},
		{Name: "ReconcileFailed", Value: failed, Unit: metrics.Count},
	}
	if run {
		clamped := 0.0
		if s.Clamped {
			clamped = 1
		}
		ms = append(ms, metrics.Metric{Name: "ReconcileWindowClamped", Value: clamped, Unit: metrics.Count})
		if !s.HighWater.IsZero() {
			ms = append(ms, metrics.Metric{Name: "ReconcileMarkAgeSeconds", Value: r.Now().Sub(s.HighWater).Seconds(), Unit: metrics.Seconds})
		}
	}
	_ = r.metrics.Emit(nil, ms...)
	for _, t := range slices.Sorted(maps.Keys(s.MissingByType)) {
		_ = r.metrics.Emit(map[string]string{"EventType": t},
			metrics.Metric{Name: "EventsFoundMissing", Value: float64(s.MissingByType[t]), Unit: metrics.Count})
	}
	if s.Stored > 0 {
		r.logger.Warn("events found missing: stored by the reconciler, never delivered by the webhook",
			"endpoint", r.cfg.Endpoint, "count", s.Stored, "by_type", s.MissingByType)
	}
	if run && s.Clamped {
		r.logger.Error("the reconciler's mark is older than the Events API's 30 days: events created in the gap cannot be listed; "+
			"compare the gap with Stripe's dashboard (Developers, Events) and the endpoint's failed deliveries",
			"endpoint", r.cfg.Endpoint, "since", s.Since)
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
