// Package webhook answers Stripe's deliveries to the Lambda Function URL.
//
// A request names its endpoint by its path: POST /billing delivers to the
// endpoint "billing". The handler checks, in this order and before touching
// the database: the method, the endpoint, the body size, the body encoding,
// and the Stripe signature over the exact bytes received. Only a verified
// event is stored, as one INSERT ... ON CONFLICT DO NOTHING, and the answer
// is 2xx only once that row has committed (new or duplicate). A failed commit
// answers 5xx so that Stripe retries.
package webhook

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/secrets"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// DefaultMaxBodyBytes is the default body limit (1 MiB). Stripe's events are
// far smaller; the limit bounds the work an unauthenticated caller can cause.
const DefaultMaxBodyBytes = 1 << 20

// DefaultStoreTimeout bounds the receipt commit. It must stay below the
// function's timeout so that a stuck database answers 5xx rather than letting
// the invocation time out.
const DefaultStoreTimeout = 5 * time.Second

// The ranges of Config's settings (config.LoadWebhook reads MAX_BODY_BYTES
// and STORE_TIMEOUT within them; New refuses anything outside).
const (
	MinBodyBytes    = 1024
	MinStoreTimeout = 100 * time.Millisecond
	MaxStoreTimeout = time.Minute
)

// Config holds the handler's settings.
type Config struct {
	MaxBodyBytes int           // 0 means DefaultMaxBodyBytes; MinBodyBytes to FunctionURLMaxPayload
	StoreTimeout time.Duration // 0 means DefaultStoreTimeout; MinStoreTimeout to MaxStoreTimeout
	// Notify: a stored receipt also wakes resident workers that LISTEN
	// (inbox.StoreAndNotify), when it commits.
	Notify bool
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	return c
}

// Validate reports every mistake, phrased as what to fix, with the
// variable names functions/webhook reads.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBodyBytes < MinBodyBytes || c.MaxBodyBytes > FunctionURLMaxPayload {
		errs = append(errs, fmt.Errorf("MAX_BODY_BYTES=%d: must be from %d to %d", c.MaxBodyBytes, MinBodyBytes, FunctionURLMaxPayload))
	}
	if c.StoreTimeout < MinStoreTimeout || c.StoreTimeout > MaxStoreTimeout {
		errs = append(errs, fmt.Errorf("STORE_TIMEOUT=%s: must be from %s to %s", c.StoreTimeout, MinStoreTimeout, MaxStoreTimeout))
	}
	return errors.Join(errs...)
}

// Keyring is what the handler needs from the signing secrets.
type Keyring interface {
	Secrets(ctx context.Context, endpoint string) ([]string, error)
	RefreshAfterMismatch(ctx context.Context, endpoint string) bool
}

// Waker starts a worker run (internal/wake): an asynchronous Lambda Invoke
// on AWS, a signal to the local runner's loop.
type Waker interface {
	Wake(ctx context.Context) error
}

// Handler turns Function URL requests into receipts.
type Handler struct {
	keyring Keyring
	db      inbox.DB
	logger  *slog.Logger
	metrics *metrics.Emitter
	cfg     Config
	waker   Waker
}

// WakeWith makes the handler wake a worker after each new receipt commits
// (stored, or a delivery that replaced a listed copy; not a duplicate,
// whose receipt is already there). Call it before serving. A failed wake
// is logged and changes nothing in the answer: the receipt is committed,
// and the worker's schedule applies it.
func (h *Handler) WakeWith(w Waker) { h.waker = w }

// New returns a Handler, as worker.New does: it fills cfg's zero fields
// with the defaults (WithDefaults), then validates it, and returns an error
// saying what to fix. em may be nil (no metrics).
func New(db inbox.DB, keyring Keyring, cfg Config, logger *slog.Logger, em *metrics.Emitter) (*Handler, error) {
	cfg = cfg.WithDefaults()
	errs := []error{cfg.Validate()}
	if db == nil {
		errs = append(errs, errors.New("no database"))
	}
	if keyring == nil {
		errs = append(errs, errors.New("no signing-secret keyring"))
	}
	if logger == nil {
		errs = append(errs, errors.New("no logger"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid webhook configuration: %w", err)
	}
	return &Handler{keyring: keyring, db: db, logger: logger, metrics: em, cfg: cfg}, nil
}

// Reasons a request is refused; they appear in logs and as the Reason
// dimension of the Rejected metric.
const (
	reasonMethod       = "method_not_allowed"
	reasonEndpoint     = "unknown_endpoint"
	reasonTooLarge     = "body_too_large"
	reasonEncoding     = "bad_encoding"
	reasonEmpty        = "empty_body"
	reasonNotSigned    = "not_signed"
	reasonBadSignature = "bad_signature"
	reasonTooOld       = "signature_too_old"
	reasonMalformed    = "malformed_event"
	reasonStoreFailed  = "store_failed"
	// reasonNoSecret: no fetch of the endpoint's signing secret has
	// succeeded since the start, so nothing can be verified; Stripe retries.
	reasonNoSecret = "secret_unavailable"
)

// The fixed bodies callers see. Internal error text goes to the log only.
var bodies = map[string]string{
	reasonMethod:       `{"error":"method not allowed: POST only"}`,
	reasonEndpoint:     `{"error":"unknown endpoint"}`,
	reasonTooLarge:     `{"error":"body too large"}`,
	reasonEncoding:     `{"error":"body is not valid base64"}`,
	reasonEmpty:        `{"error":"empty body"}`,
	reasonNotSigned:    `{"error":"missing Stripe-Signature header"}`,
	reasonBadSignature: `{"error":"invalid signature"}`,
	reasonTooOld:       `{"error":"signature timestamp outside tolerance"}`,
	reasonMalformed:    `{"error":"body is not a Stripe event with id and type"}`,
	reasonStoreFailed:  `{"error":"receipt not stored; retry"}`,
	reasonNoSecret:     `{"error":"signing secret unavailable; retry"}`,
}

var statuses = map[string]int{
	reasonMethod:       http.StatusMethodNotAllowed,
	reasonEndpoint:     http.StatusNotFound,
	reasonTooLarge:     http.StatusRequestEntityTooLarge,
	reasonEncoding:     http.StatusBadRequest,
	reasonEmpty:        http.StatusBadRequest,
	reasonNotSigned:    http.StatusBadRequest,
	reasonBadSignature: http.StatusBadRequest,
	reasonTooOld:       http.StatusBadRequest,
	reasonMalformed:    http.StatusBadRequest,
	reasonStoreFailed:  http.StatusInternalServerError,
	reasonNoSecret:     http.StatusServiceUnavailable,
}

// Handle answers one Function URL request. It never returns an error: every
// outcome is an HTTP answer (an error would make the Function URL answer 502
// with no body and no log line of ours).
func (h *Handler) Handle(ctx context.Context, req events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	start := time.Now()
	rec := record{endpoint: endpointFromPath(req.RawPath), requestID: req.RequestContext.RequestID}
	resp := h.handle(ctx, req, &rec)
	rec.status = resp.StatusCode
	h.finish(ctx, rec, time.Since(start))
	return resp, nil
}

// record is what one request logs.
type record struct {
	requestID string
	endpoint  string
	eventID   string
	eventType string
	outcome   string // stored, replaced, duplicate, rejected, failed
	reason    string
	status    int
	err       error
}

func (h *Handler) handle(ctx context.Context, req events.LambdaFunctionURLRequest, rec *record) events.LambdaFunctionURLResponse {
	if !strings.EqualFold(req.RequestContext.HTTP.Method, http.MethodPost) {
		return h.reject(rec, reasonMethod, nil)
	}
	secretsList, err := h.keyring.Secrets(ctx, rec.endpoint)
	if errors.Is(err, secrets.ErrUnknownEndpoint) {
		return h.reject(rec, reasonEndpoint, nil)
	} else if err != nil {
		// The keyring bounds the fetch (secrets.Options.FetchTimeout), so
		// this answers well before the function's timeout.
		rec.outcome, rec.reason, rec.err = "failed", reasonNoSecret, err
		return response(statuses[reasonNoSecret], bodies[reasonNoSecret])
	}
	body, reason := h.decodeBody(req)
	if reason != "" {
		return h.reject(rec, reason, nil)
	}
	header := headerValue(req.Headers, "Stripe-Signature")

	ev, err := stripeevent.Verify(body, header, secretsList)
	if errors.Is(err, stripeevent.ErrBadSignature) && h.keyring.RefreshAfterMismatch(ctx, rec.endpoint) {
		// The secret may have been rolled since it was cached.
		if secretsList, err = h.keyring.Secrets(ctx, rec.endpoint); err == nil {
			ev, err = stripeevent.Verify(body, header, secretsList)
		}
	}
	if err != nil {
		return h.reject(rec, verifyReason(err), err)
	}
	rec.eventID, rec.eventType = ev.ID, ev.Type

	storeCtx, cancel := context.WithTimeout(ctx, h.cfg.StoreTimeout)
	defer cancel()
	store := inbox.Store
	if h.cfg.Notify {
		store = inbox.StoreAndNotify
	}
	outcome, err := store(storeCtx, h.db, rec.endpoint, ev)
	if err != nil {
		rec.outcome, rec.reason, rec.err = "failed", reasonStoreFailed, err
		return response(statuses[reasonStoreFailed], bodies[reasonStoreFailed])
	}
	rec.outcome = string(outcome)
	if outcome == inbox.Duplicate {
		// A statistic (inboxctl status): never waits, never fails the answer.
		if _, err := inbox.CountDuplicate(storeCtx, h.db, rec.endpoint, ev.ID); err != nil {
			h.logger.WarnContext(ctx, "counting a duplicate", "endpoint", rec.endpoint, "event_id", ev.ID, "error", err.Error())
		}
	}
	if h.waker != nil && outcome != inbox.Duplicate {
		if err := h.waker.Wake(ctx); err != nil {
			h.logger.WarnContext(ctx, "waking the worker failed; the schedule will apply the receipt",
				"endpoint", rec.endpoint, "event_id", ev.ID, "error", err.Error())
		}
	}
	answer := outcome
	if outcome == inbox.Replaced {
		// The reconciler had stored the event first; this delivery's copy
		// replaced it and is the one the worker books. For Stripe (and a
		// sender reading the body) it is stored: only the log and the
		// ListedCopyReplaced metric say it was listed first.
		answer = inbox.Stored
	}
	return response(http.StatusOK, `{"received":true,"outcome":"`+string(answer)+`"}`)
}

func (h *Handler) decodeBody(req events.LambdaFunctionURLRequest) ([]byte, string) {
	limit := h.cfg.MaxBodyBytes
	var body []byte
	if req.IsBase64Encoded {
		if base64.StdEncoding.EncodedLen(limit) < len(req.Body) {
			return nil, reasonTooLarge
		}
		b, err := base64.StdEncoding.DecodeString(req.Body)
		if err != nil {
			return nil, reasonEncoding
		}
		body = b
	} else {
		body = []byte(req.Body)
	}
	if len(body) > limit {
		return nil, reasonTooLarge
	}
	if len(body) == 0 {
		return nil, reasonEmpty
	}
	return body, ""
}

func verifyReason(err error) string {
	switch {
	case errors.Is(err, stripeevent.ErrNotSigned):
		return reasonNotSigned
	case errors.Is(err, stripeevent.ErrTooOld):
		return reasonTooOld
	case errors.Is(err, stripeevent.ErrMalformed):
		return reasonMalformed
	default:
		return reasonBadSignature
	}
}

func (h *Handler) reject(rec *record, reason string, err error) events.LambdaFunctionURLResponse {
	rec.outcome, rec.reason, rec.err = "rejected", reason, err
	return response(statuses[reason], bodies[reason])
}

func (h *Handler) finish(ctx context.Context, rec record, d time.Duration) {
	attrs := []any{
		"request_id", rec.requestID,
		"endpoint", rec.endpoint,
		"event_id", rec.eventID,
		"event_type", rec.eventType,
		"outcome", rec.outcome,
		"status", rec.status,
		"duration_ms", d.Milliseconds(),
	}
	if rec.reason != "" {
		attrs = append(attrs, "reason", rec.reason)
	}
	if rec.err != nil {
		attrs = append(attrs, "error", rec.err.Error())
	}
	level := slog.LevelInfo
	switch rec.outcome {
	case "failed":
		level = slog.LevelError
	case "rejected":
		level = slog.LevelWarn
	}
	h.logger.Log(ctx, level, "webhook", attrs...)

	var err error
	switch rec.outcome {
	case string(inbox.Stored):
		err = h.metrics.Emit(nil, metrics.Metric{Name: "Received", Value: 1, Unit: metrics.Count})
	case string(inbox.Duplicate):
		err = h.metrics.Emit(nil, metrics.Metric{Name: "Duplicate", Value: 1, Unit: metrics.Count})
	case string(inbox.Replaced):
		err = h.metrics.Emit(nil, metrics.Metric{Name: "ListedCopyReplaced", Value: 1, Unit: metrics.Count})
	case "failed":
		name := "StoreFailed"
		if rec.reason == reasonNoSecret {
			name = "SecretUnavailable"
		}
		err = h.metrics.Emit(nil, metrics.Metric{Name: name, Value: 1, Unit: metrics.Count})
	case "rejected":
		// By reason (the dashboard) and in total (the WebhookRejected
		// alarm: an alarm cannot sum a SEARCH over the reasons).
		rejected := metrics.Metric{Name: "Rejected", Value: 1, Unit: metrics.Count}
		if err = h.metrics.Emit(map[string]string{"Reason": rec.reason}, rejected); err == nil {
			err = h.metrics.Emit(nil, rejected)
		}
	}
	if err != nil {
		h.logger.ErrorContext(ctx, "writing metrics", "error", err)
	}
}

// endpointFromPath maps "/billing" (or "/billing/") to "billing". Anything
// else, including "/", yields a name no keyring holds.
func endpointFromPath(p string) string {
	p = strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/")
	if strings.Contains(p, "/") {
		return ""
	}
	return p
}

// headerValue finds a header case-insensitively (Function URLs lower-case
// header names; local callers may not).
func headerValue(hs map[string]string, name string) string {
	if v, ok := hs[strings.ToLower(name)]; ok {
		return v
	}
	for k, v := range hs {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

func response(status int, body string) events.LambdaFunctionURLResponse {
	return events.LambdaFunctionURLResponse{
		StatusCode: status,
		Headers:    map[string]string{"content-type": "application/json"},
		Body:       body,
	}
}
