package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/storecall"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// DBSink stores pages in the inbox through a pool (the store function, and
// the local runner and backfill, which reach the database directly).
type DBSink struct {
	DB inbox.DB // a pool: each receipt is its own autocommit INSERT (see inbox.Store)
}

// HighWater reads the endpoint's mark.
func (d DBSink) HighWater(ctx context.Context, endpoint string) (time.Time, bool, error) {
	return inbox.HighWater(ctx, d.DB, endpoint)
}

// StorePage stores each event with the webhook's INSERT, source 'reconcile'.
// An event the list returns that is not an event object (no id or type) fails
// the page: nothing is skipped silently, and the mark stays.
func (d DBSink) StorePage(ctx context.Context, endpoint string, events []json.RawMessage) (Counts, error) {
	var c Counts
	for _, raw := range events {
		ev, err := stripeevent.Parse(raw)
		if err != nil {
			return c, fmt.Errorf("a listed event: %w", err)
		}
		out, err := inbox.StoreFrom(ctx, d.DB, inbox.SourceReconcile, endpoint, ev)
		if err != nil {
			return c, err
		}
		switch out {
		case inbox.Stored:
			c.add(Counts{Stored: 1, MissingByType: map[string]int{ev.Type: 1}})
		case inbox.Duplicate:
			c.AlreadyPresent++
		}
	}
	return c, nil
}

// Advance moves the endpoint's mark to to (never backwards).
func (d DBSink) Advance(ctx context.Context, endpoint string, to time.Time) error {
	_, err := inbox.AdvanceHighWater(ctx, d.DB, endpoint, to)
	return err
}

// The store function's protocol: one JSON request per Lambda invocation,
// from RemoteSink (the reconciler outside the VPC) to ProvenStore and
// StoreHandler (inside), in an invokeproof.Envelope: the StoreRequest and
// the reconciler's proof that it sent it.
const (
	OpHighWater = "high_water"
	OpStore     = "store"
	OpAdvance   = "advance"
)

// StoreRequest is the store function's input.
type StoreRequest struct {
	Op       string            `json:"op"`
	Endpoint string            `json:"endpoint"`
	Events   []json.RawMessage `json:"events,omitempty"` // OpStore
	To       time.Time         `json:"to,omitzero"`      // OpAdvance
}

// StoreResponse is the store function's output.
type StoreResponse struct {
	HighWater *time.Time `json:"high_water,omitempty"` // OpHighWater, OpAdvance; nil: none yet
	Counts    *Counts    `json:"counts,omitempty"`     // OpStore
}

// MaxStoreEvents bounds the events of one store request (a page is at most
// 100).
const MaxStoreEvents = PageLimit

// ErrBadStoreRequest means the store function refused a request.
var ErrBadStoreRequest = errors.New("bad store request")

// StoreHandler is the store function: it serves StoreRequests for the
// endpoints it is configured with, and refuses any other.
type StoreHandler struct {
	Sink      Sink
	Endpoints []string
	Now       func() time.Time // nil: time.Now
}

// Handle serves one request.
func (h StoreHandler) Handle(ctx context.Context, req StoreRequest) (StoreResponse, error) {
	known := false
	for _, e := range h.Endpoints {
		known = known || e == req.Endpoint
	}
	if !known {
		return StoreResponse{}, fmt.Errorf("%w: endpoint %q is not reconciled here (configured: %v)", ErrBadStoreRequest, req.Endpoint, h.Endpoints)
	}
	switch req.Op {
	case OpHighWater:
		hw, ok, err := h.Sink.HighWater(ctx, req.Endpoint)
		if err != nil || !ok {
			return StoreResponse{}, err
		}
		return StoreResponse{HighWater: &hw}, nil
	case OpStore:
		if len(req.Events) == 0 || len(req.Events) > MaxStoreEvents {
			return StoreResponse{}, fmt.Errorf("%w: %d events; a store request carries 1 to %d", ErrBadStoreRequest, len(req.Events), MaxStoreEvents)
		}
		c, err := h.Sink.StorePage(ctx, req.Endpoint, req.Events)
		if err != nil {
			return StoreResponse{}, err
		}
		return StoreResponse{Counts: &c}, nil
	case OpAdvance:
		now := time.Now
		if h.Now != nil {
			now = h.Now
		}
		if req.To.IsZero() || req.To.After(now().Add(time.Minute)) {
			return StoreResponse{}, fmt.Errorf("%w: advance to %v: must be a time not in the future", ErrBadStoreRequest, req.To)
		}
		if err := h.Sink.Advance(ctx, req.Endpoint, req.To); err != nil {
			return StoreResponse{}, err
		}
		to := req.To
		return StoreResponse{HighWater: &to}, nil
	}
	return StoreResponse{}, fmt.Errorf("%w: op %q is not one of %s, %s, %s", ErrBadStoreRequest, req.Op, OpHighWater, OpStore, OpAdvance)
}

// StoreAudience is the invokeproof audience of the store function's
// requests: a proof made for another kind of request (a write-back) does not
// open them.
const StoreAudience = "reconcilestore"

// Opener checks a proven request and returns its payload
// (invokeproof.Verifier, admitting the reconciler's role).
type Opener = storecall.Opener

// ErrRefused means the store function refused a request that is not proven
// to come from the reconciler (nothing was read or written).
var ErrRefused = errors.New("refused: the request is not proven to come from the reconciler")

// ProvenStore is the store function's Lambda handler (storecall.Proven): it
// serves a request only once Proofs has proven that the reconciler's role
// sent it. Anyone else who may invoke the function (a role with
// lambda:InvokeFunction on "*") is refused before the database is touched,
// and the refusal is logged and counted: InvokeProofRefused (alarmed), with
// one more line by Reason (missing, malformed, stale, forged, principal).
type ProvenStore = storecall.Proven[StoreRequest, StoreResponse, StoreHandler]

// Guard implements storecall.Handler.
func (StoreHandler) Guard() storecall.Guard {
	return storecall.Guard{
		Audience: StoreAudience, Name: "the store function", ErrRefused: ErrRefused, ErrBadRequest: ErrBadStoreRequest,
		RefusedLog: "store request refused: not proven to come from the reconciler", ProvenLog: "proven store request",
	}
}

// LogAttrs implements storecall.Handler.
func (StoreHandler) LogAttrs(req StoreRequest) []any {
	return []any{"op", req.Op, "endpoint", req.Endpoint}
}
