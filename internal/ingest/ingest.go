// Package ingest stores the Stripe events Amazon EventBridge delivers: the
// events of a Stripe event destination of type amazon_eventbridge
// (https://docs.stripe.com/event-destinations/eventbridge), which Stripe
// puts on a partner event bus named after its partner event source
// aws.partner/stripe.com/ed_....
//
// There is no signature on this path. Trust comes from the bus (only the
// partner source can put events on a partner event bus) and from IAM: the
// stack's rule hands the events to an SQS queue whose policy admits only
// that rule, and the ingest function reads that queue itself (queue.go), so
// no payload handed to the function can inject an event.
//
// Ingest takes the JSON EventBridge hands a target (the envelope: version,
// id, detail-type, source, account, time, region, resources, detail),
// checks that its source is one the stage names (Sources), and that its
// detail is a Stripe event: a v1 Event with an evt_ id (a snapshot
// destination) or a v2 thin notification (object "v2.core.event", a thin
// destination; https://docs.stripe.com/api/v2/events). It then stores the
// detail through the webhook's one store statement with source
// 'eventbridge' (inbox.StoreFrom): the same event from the webhook, from
// EventBridge or from the reconciler is one receipt, whichever comes first
// or both at once. A refusal (Refusal, matched with errors.Is(err,
// ErrRefused)) is permanent: retrying the same message cannot change it.
// Any other error is transient.
package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// PartnerPrefix begins every Stripe partner event source: Stripe names the
// source aws.partner/stripe.com/ed_... after the event destination
// (https://docs.stripe.com/event-destinations/eventbridge).
const PartnerPrefix = "aws.partner/stripe.com/"

// Sources maps EventBridge sources to the endpoint their events belong to.
type Sources struct {
	// Exact maps a source (aws.partner/stripe.com/ed_...) to its endpoint.
	Exact map[string]string
	// Default, when not empty, is the endpoint of any other source that
	// begins with PartnerPrefix (the local runner's default:
	// WEBHOOK_ENDPOINT). The deployed function names its sources exactly.
	Default string
}

// Endpoint returns the endpoint of source, or false when the stage does not
// name it.
func (s Sources) Endpoint(source string) (string, bool) {
	if ep, ok := s.Exact[source]; ok {
		return ep, true
	}
	if s.Default != "" && strings.HasPrefix(source, PartnerPrefix) && len(source) > len(PartnerPrefix) {
		return s.Default, true
	}
	return "", false
}

// Names lists the exact sources, sorted (for logs and messages).
func (s Sources) Names() []string {
	var out []string
	for k := range s.Exact {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ErrRefused is matched by every Refusal.
var ErrRefused = errors.New("refused")

// Reasons of a refusal: the Reason attribute of a dead-lettered message and
// the Reason dimension of the IngestRefused metric.
const (
	ReasonNotEnvelope   = "not_an_eventbridge_event"
	ReasonUnknownSource = "unknown_source"
	ReasonNotStripe     = "not_a_stripe_event"
	ReasonTooLarge      = "too_large"
)

// Refusal is a permanent refusal: the message can never be stored.
type Refusal struct {
	Reason  string // one of the Reason constants
	Message string // what was wrong, for the log, the dead-letter queue and a local caller
}

func (r *Refusal) Error() string        { return "refused (" + r.Reason + "): " + r.Message }
func (r *Refusal) Is(target error) bool { return target == ErrRefused }

func refuse(reason, format string, args ...any) error {
	return &Refusal{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// ReasonOf returns err's refusal reason, or "" when err is not a refusal.
func ReasonOf(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// Envelope is the JSON EventBridge hands a rule's target
// (https://docs.aws.amazon.com/eventbridge/latest/ref/overiew-event-structure.html).
type Envelope struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       string          `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

// MaxEnvelopeBytes bounds an envelope: EventBridge's own limit on an
// event is 256 KB (PutEvents), and an SQS message's is 256 KiB.
const MaxEnvelopeBytes = 256 * 1024

// DefaultStoreTimeout bounds the receipt's commit.
const DefaultStoreTimeout = 5 * time.Second

// Outcome is what Ingest did: stored (new, or the delivery replaced a copy
// the reconciler listed first) or duplicate.
type Outcome string

const (
	Stored    Outcome = "stored"
	Duplicate Outcome = "duplicate"
)

// Result says what one envelope became.
type Result struct {
	Outcome   Outcome
	Replaced  bool // the delivery replaced a copy the reconciler listed first
	Source    string
	Endpoint  string
	EventID   string
	EventType string
}

// Handler stores envelopes.
type Handler struct {
	db           inbox.DB
	sources      Sources
	logger       *slog.Logger
	metrics      *metrics.Emitter
	storeTimeout time.Duration
	waker        Waker
}

// Waker starts a worker run (internal/wake): an asynchronous Lambda Invoke
// on AWS, a signal to the local runner's loop. The webhook's, for receipts
// that come through EventBridge: without it they would wait for the
// worker's schedule (up to a minute) when the worker is not resident.
type Waker interface {
	Wake(ctx context.Context) error
}

// WakeWith makes the handler wake a worker once new receipts committed:
// after each stored request of the local route (HTTPHandler), and once per
// queue drain that stored any (Drainer.Drain: one Invoke, not one per
// message). Call it before serving. A failed wake is logged and changes
// nothing: the receipts are committed, and the worker's schedule applies
// them.
func (h *Handler) WakeWith(w Waker) { h.waker = w }

func (h *Handler) wake(ctx context.Context) {
	if h.waker == nil {
		return
	}
	if err := h.waker.Wake(ctx); err != nil {
		h.logger.WarnContext(ctx, "waking the worker failed; the schedule will apply the receipts", "error", err.Error())
	}
}

// New returns a Handler. db must be a pool (each receipt is its own
// autocommit statement, see inbox.Store); em may be nil.
func New(db inbox.DB, sources Sources, logger *slog.Logger, em *metrics.Emitter) (*Handler, error) {
	var errs []error
	if db == nil {
		errs = append(errs, errors.New("no database"))
	}
	if logger == nil {
		errs = append(errs, errors.New("no logger"))
	}
	if len(sources.Exact) == 0 && sources.Default == "" {
		errs = append(errs, errors.New("no EventBridge source: name each Stripe event source and its endpoint (EVENTBRIDGE_SOURCES=aws.partner/stripe.com/ed_...=billing)"))
	}
	for src := range sources.Exact {
		if !strings.HasPrefix(src, PartnerPrefix) || len(src) == len(PartnerPrefix) {
			errs = append(errs, fmt.Errorf("source %q is not a Stripe partner event source (%sed_...)", src, PartnerPrefix))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid ingest configuration: %w", err)
	}
	return &Handler{db: db, sources: sources, logger: logger, metrics: em, storeTimeout: DefaultStoreTimeout}, nil
}

// Ingest checks one envelope and stores its event. It returns nil only once
// the receipt has committed (stored or duplicate). A *Refusal is permanent;
// any other error is transient (the database), and the same envelope may be
// tried again.
func (h *Handler) Ingest(ctx context.Context, body []byte) (Result, error) {
	start := time.Now()
	res, err := h.ingest(ctx, body)
	h.finish(ctx, res, err, time.Since(start))
	return res, err
}

func (h *Handler) ingest(ctx context.Context, body []byte) (Result, error) {
	var res Result
	if len(body) > MaxEnvelopeBytes {
		return res, refuse(ReasonTooLarge, "%d bytes; an EventBridge event is at most %d", len(body), MaxEnvelopeBytes)
	}
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&env); err != nil {
		return res, refuse(ReasonNotEnvelope, "not the JSON EventBridge hands a target: %v", err)
	}
	if env.Source == "" || len(env.Detail) == 0 || string(env.Detail) == "null" {
		return res, refuse(ReasonNotEnvelope, "an EventBridge event has a source and a detail")
	}
	res.Source = env.Source
	endpoint, ok := h.sources.Endpoint(env.Source)
	if !ok {
		return res, refuse(ReasonUnknownSource, "source %q is not one this stage names (%s)", env.Source, h.describeSources())
	}
	res.Endpoint = endpoint
	ev, err := StripeEvent(env.Detail)
	if err != nil {
		return res, err
	}
	res.EventID, res.EventType = ev.ID, ev.Type

	storeCtx, cancel := context.WithTimeout(ctx, h.storeTimeout)
	defer cancel()
	out, err := inbox.StoreFrom(storeCtx, h.db, inbox.SourceEventBridge, endpoint, ev)
	if err != nil {
		return res, err
	}
	switch out {
	case inbox.Duplicate:
		res.Outcome = Duplicate
	case inbox.Replaced:
		res.Outcome, res.Replaced = Stored, true
	default:
		res.Outcome = Stored
	}
	return res, nil
}

func (h *Handler) describeSources() string {
	parts := h.sources.Names()
	if h.sources.Default != "" {
		parts = append(parts, PartnerPrefix+"* (endpoint "+h.sources.Default+")")
	}
	return strings.Join(parts, ", ")
}

// StripeEvent checks that detail is a Stripe event and reads the fields the
// inbox stores: a v1 Event (object "event", an evt_ id; what a snapshot
// destination delivers, https://docs.stripe.com/api/events/object) or a
// v2 thin notification (object "v2.core.event"; what a thin destination
// delivers, https://docs.stripe.com/api/v2/events; stripe-go's ThinEvent).
// Payload is detail's exact bytes.
func StripeEvent(detail json.RawMessage) (stripeevent.Event, error) {
	var head struct {
		Object string `json:"object"`
		ID     string `json:"id"`
	}
	if err := json.Unmarshal(detail, &head); err != nil {
		return stripeevent.Event{}, refuse(ReasonNotStripe, "detail is not a JSON object: %v", err)
	}
	switch head.Object {
	case "event", ThinObject:
	default:
		return stripeevent.Event{}, refuse(ReasonNotStripe, "detail.object is %q; a Stripe event's is \"event\" (snapshot) or %q (thin)", head.Object, ThinObject)
	}
	if !strings.HasPrefix(head.ID, "evt_") {
		return stripeevent.Event{}, refuse(ReasonNotStripe, "detail.id %q is not a Stripe event id (evt_...)", head.ID)
	}
	ev, err := stripeevent.Parse(detail)
	if err != nil {
		return stripeevent.Event{}, refuse(ReasonNotStripe, "%v", err)
	}
	return ev, nil
}

// ThinObject is a thin event's object.
const ThinObject = "v2.core.event"

func (h *Handler) finish(ctx context.Context, res Result, err error, d time.Duration) {
	attrs := []any{
		"source", res.Source,
		"endpoint", res.Endpoint,
		"event_id", res.EventID,
		"event_type", res.EventType,
		"duration_ms", d.Milliseconds(),
	}
	level := slog.LevelInfo
	var m []metrics.Metric
	var dims map[string]string
	switch reason := ReasonOf(err); {
	case reason != "":
		level = slog.LevelWarn
		attrs = append(attrs, "outcome", "refused", "reason", reason, "error", err.Error())
		// By reason (the dashboard) and in total (the IngestRefused alarm).
		dims = map[string]string{"Reason": reason}
		m = append(m, metrics.Metric{Name: "IngestRefused", Value: 1, Unit: metrics.Count})
	case err != nil:
		level = slog.LevelError
		attrs = append(attrs, "outcome", "failed", "error", err.Error())
		m = append(m, metrics.Metric{Name: "IngestFailed", Value: 1, Unit: metrics.Count})
	default:
		outcome := string(res.Outcome)
		if res.Replaced {
			outcome = string(inbox.Replaced)
		}
		attrs = append(attrs, "outcome", outcome)
		name := map[string]string{"stored": "IngestReceived", "duplicate": "IngestDuplicate", "replaced": "ListedCopyReplaced"}[outcome]
		m = append(m, metrics.Metric{Name: name, Value: 1, Unit: metrics.Count})
	}
	h.logger.Log(ctx, level, "eventbridge", attrs...)
	if dims != nil {
		if e := h.metrics.Emit(dims, m...); e != nil {
			h.logger.ErrorContext(ctx, "writing metrics", "error", e)
		}
	}
	if e := h.metrics.Emit(nil, m...); e != nil {
		h.logger.ErrorContext(ctx, "writing metrics", "error", e)
	}
}
