package ops

import (
	"context"
	"time"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/outbox"
)

// Status is the inbox at a glance.
type Status struct {
	At                          time.Time `json:"at"`
	Backlog                     int       `json:"backlog"`
	OldestUnprocessedAgeSeconds float64   `json:"oldest_unprocessed_age_seconds"`
	NeedsReview                 int       `json:"needs_review"`
	OpenAnomalies               int       `json:"open_anomalies"`
	MaxAttempts                 int       `json:"max_attempts"`
	// The outbox (outbox.ReadBacklog): unpublished rows still being
	// tried, the age of the oldest, and the rows that used up
	// OutboxMaxAttempts and wait for a human (inboxctl outbox).
	OutboxBacklog          int     `json:"outbox_backlog"`
	OutboxOldestAgeSeconds float64 `json:"outbox_oldest_age_seconds"`
	OutboxNeedsReview      int     `json:"outbox_needs_review"`
	OutboxMaxAttempts      int     `json:"outbox_max_attempts"`
	// LastHour: receipts and duplicate deliveries per type, and
	// receipt-to-effect latency, over the last hour.
	LastHour LastHour `json:"last_hour"`
	// APIVersions: receipts per endpoint and API version over the last
	// day; Expected is false for versions other than ExpectedAPIVersion.
	ExpectedAPIVersion string       `json:"expected_api_version,omitempty"`
	APIVersions        []APIVersion `json:"api_versions"`
}

// LastHour is Status's hour.
type LastHour struct {
	Receipts   int               `json:"receipts"`
	Duplicates int               `json:"duplicates"`
	Types      []inbox.TypeCount `json:"types"`
	// Sources: receipts per source (webhook, eventbridge, reconcile).
	Sources []inbox.SourceCount `json:"sources"`
	Latency inbox.Latency       `json:"latency"`
}

// APIVersion is one endpoint's receipts of one API version.
type APIVersion struct {
	inbox.VersionCount
	Expected bool `json:"expected"`
}

func (o *Ops) status(ctx context.Context) (*Status, error) {
	now := o.Now().UTC()
	s := &Status{At: now, MaxAttempts: o.MaxAttempts, OutboxMaxAttempts: o.OutboxMaxAttempts, ExpectedAPIVersion: o.APIVersion, APIVersions: []APIVersion{}}
	b, err := inbox.Stats(ctx, o.Pool, o.MaxAttempts, nil)
	if err != nil {
		return nil, err
	}
	s.Backlog, s.OldestUnprocessedAgeSeconds, s.NeedsReview = b.Count, b.OldestAgeSeconds, b.NeedsReview
	ob, err := outbox.ReadBacklog(ctx, o.Pool, o.OutboxMaxAttempts, nil)
	if err != nil {
		return nil, err
	}
	s.OutboxBacklog, s.OutboxOldestAgeSeconds, s.OutboxNeedsReview = ob.Count, ob.OldestAgeSeconds, ob.NeedsReview
	if s.OpenAnomalies, err = handlers.UnresolvedAnomalies(ctx, o.Pool); err != nil {
		return nil, err
	}
	hour := now.Add(-time.Hour)
	if s.LastHour.Types, err = inbox.TypesSince(ctx, o.Pool, hour); err != nil {
		return nil, err
	}
	if s.LastHour.Sources, err = inbox.SourcesSince(ctx, o.Pool, hour); err != nil {
		return nil, err
	}
	for _, t := range s.LastHour.Types {
		s.LastHour.Receipts += t.Receipts
		s.LastHour.Duplicates += t.Duplicates
	}
	if s.LastHour.Latency, err = inbox.LatencySince(ctx, o.Pool, hour); err != nil {
		return nil, err
	}
	versions, err := inbox.VersionsSince(ctx, o.Pool, now.Add(-24*time.Hour))
	if err != nil {
		return nil, err
	}
	for _, v := range versions {
		s.APIVersions = append(s.APIVersions, APIVersion{VersionCount: v, Expected: o.APIVersion == "" || v.APIVersion == o.APIVersion})
	}
	return s, nil
}
