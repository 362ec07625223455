package writeback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stripe-inbox/inbox/internal/storecall"
)

// The store function's protocol, as the reconciler's (internal/reconcile,
// RemoteSink and ProvenStore): the writeback function outside the VPC (it
// reaches Stripe) hands each of the sender's store operations to the
// writebackstore function inside the VPC (it reaches the database) in a
// synchronous, IAM-authorized Invoke, in an invokeproof.Envelope: the
// StoreRequest and the sender's proof that it sent it.
const (
	// OpClaim is Store.Claim.
	OpClaim = "claim"
	// OpRecord is Store.Record: a result (done), a failure to retry, a
	// give-back (release) or a park, against the claim's token.
	OpRecord = "record"
	// OpBacklog reads the backlog's gauges (EmitBacklog).
	OpBacklog = "backlog"
)

// StoreAudience is the invokeproof audience of the writebackstore
// function's requests: a proof made for the reconciler's store does not
// open them, nor the reverse.
const StoreAudience = "writebackstore"

// Bounds of a store request: what the sender sends is well inside them.
const (
	MaxStoreClaim    = 100
	MaxStoreOutcomes = 100
	MaxStoreLease    = time.Hour
)

// StoreRequest is the writebackstore function's input.
type StoreRequest struct {
	Op string `json:"op"`
	// OpClaim.
	Limit       int           `json:"limit,omitempty"`
	Lease       time.Duration `json:"lease,omitempty"`
	KeyLifetime time.Duration `json:"key_lifetime,omitempty"`
	// OpRecord.
	Token       string    `json:"token,omitempty"`
	MaxAttempts int       `json:"max_attempts,omitempty"`
	Outcomes    []Outcome `json:"outcomes,omitempty"`
}

// StoreResponse is the writebackstore function's output.
type StoreResponse struct {
	Token    string   `json:"token,omitempty"`    // OpClaim
	Intents  []Intent `json:"intents,omitempty"`  // OpClaim
	Recorded *int     `json:"recorded,omitempty"` // OpRecord
	Backlog  *Backlog `json:"backlog,omitempty"`  // OpBacklog
}

// ErrBadStoreRequest means the store function refused a request.
var ErrBadStoreRequest = errors.New("bad write-back store request")

// StoreHandler serves StoreRequests on the database.
type StoreHandler struct {
	Store DBStore
}

// Handle serves one request.
func (h StoreHandler) Handle(ctx context.Context, req StoreRequest) (StoreResponse, error) {
	switch req.Op {
	case OpClaim:
		if req.Limit < 1 || req.Limit > MaxStoreClaim {
			return StoreResponse{}, fmt.Errorf("%w: claim limit %d: must be 1 to %d", ErrBadStoreRequest, req.Limit, MaxStoreClaim)
		}
		if req.Lease < time.Second || req.Lease > MaxStoreLease {
			return StoreResponse{}, fmt.Errorf("%w: lease %s: must be 1s to %s", ErrBadStoreRequest, req.Lease, MaxStoreLease)
		}
		if req.KeyLifetime < time.Minute {
			return StoreResponse{}, fmt.Errorf("%w: key lifetime %s: must be at least 1m (Stripe keeps a key 24h)", ErrBadStoreRequest, req.KeyLifetime)
		}
		token, intents, err := h.Store.Claim(ctx, req.Limit, req.Lease, req.KeyLifetime)
		if err != nil {
			return StoreResponse{}, err
		}
		return StoreResponse{Token: token, Intents: intents}, nil
	case OpRecord:
		if req.Token == "" || req.MaxAttempts < 1 || len(req.Outcomes) == 0 || len(req.Outcomes) > MaxStoreOutcomes {
			return StoreResponse{}, fmt.Errorf("%w: a record carries the claim's token, max_attempts ≥ 1 and 1 to %d outcomes", ErrBadStoreRequest, MaxStoreOutcomes)
		}
		for _, o := range req.Outcomes {
			switch o.Kind {
			case Done, Retry, Release, Park:
			default:
				return StoreResponse{}, fmt.Errorf("%w: intent %d: unknown outcome %q", ErrBadStoreRequest, o.ID, o.Kind)
			}
			if o.Delay < 0 || o.Delay > 24*time.Hour {
				return StoreResponse{}, fmt.Errorf("%w: intent %d: delay %s: must be 0 to 24h", ErrBadStoreRequest, o.ID, o.Delay)
			}
		}
		n, err := h.Store.Record(ctx, req.Token, req.MaxAttempts, req.Outcomes)
		if err != nil {
			return StoreResponse{}, err
		}
		return StoreResponse{Recorded: &n}, nil
	case OpBacklog:
		b, err := h.Store.Backlog(ctx)
		if err != nil {
			return StoreResponse{}, err
		}
		return StoreResponse{Backlog: &b}, nil
	}
	return StoreResponse{}, fmt.Errorf("%w: op %q is not one of %s, %s, %s", ErrBadStoreRequest, req.Op, OpClaim, OpRecord, OpBacklog)
}

// Opener checks a proven request and returns its payload
// (invokeproof.Verifier, admitting the writeback function's role).
type Opener = storecall.Opener

// ErrRefused means the store function refused a request that is not proven
// to come from the writeback function (nothing was read or written).
var ErrRefused = errors.New("refused: the request is not proven to come from the write-back sender")

// ProvenStore is the writebackstore function's Lambda handler
// (storecall.Proven): it serves a request only once Proofs has proven that
// the writeback function's role sent it. Anyone else who may invoke the
// function is refused before the database is touched, and the refusal is
// logged and counted: InvokeProofRefused (alarmed), with one more line by
// Reason.
type ProvenStore = storecall.Proven[StoreRequest, StoreResponse, StoreHandler]

// Guard implements storecall.Handler.
func (StoreHandler) Guard() storecall.Guard {
	return storecall.Guard{
		Audience: StoreAudience, Name: "the write-back store function", ErrRefused: ErrRefused, ErrBadRequest: ErrBadStoreRequest,
		RefusedLog: "write-back store request refused: not proven to come from the write-back sender", ProvenLog: "proven write-back store request",
	}
}

// LogAttrs implements storecall.Handler.
func (StoreHandler) LogAttrs(req StoreRequest) []any { return []any{"op", req.Op} }

// Invoker is the part of the Lambda client RemoteStore uses
// (storecall.Invoker).
type Invoker = storecall.Invoker

// Prover signs a request (invokeproof.Signer).
type Prover = storecall.Prover

// RemoteStore is the Store of the writeback function outside the VPC: each
// call is a synchronous, IAM-authorized Invoke of the writebackstore
// function (storecall.Call), proven with Prover (the function's role
// credentials).
type RemoteStore struct {
	Lambda   Invoker
	Function string // the store function's name or ARN
	Prover   Prover
}

func (r RemoteStore) call(ctx context.Context, req StoreRequest) (StoreResponse, error) {
	return storecall.Call[StoreResponse](ctx, storecall.Caller{
		Lambda: r.Lambda, Function: r.Function, Prover: r.Prover, Audience: StoreAudience,
		Name: "the write-back store function", Sender: "the write-back sender",
	}, req.Op, req)
}

// Claim implements Store.
func (r RemoteStore) Claim(ctx context.Context, limit int, lease, keyLifetime time.Duration) (string, []Intent, error) {
	res, err := r.call(ctx, StoreRequest{Op: OpClaim, Limit: limit, Lease: lease, KeyLifetime: keyLifetime})
	if err != nil {
		return "", nil, err
	}
	if res.Token == "" {
		return "", nil, errors.New("the write-back store function answered a claim without a token")
	}
	return res.Token, res.Intents, nil
}

// Record implements Store.
func (r RemoteStore) Record(ctx context.Context, token string, maxAttempts int, outcomes []Outcome) (int, error) {
	res, err := r.call(ctx, StoreRequest{Op: OpRecord, Token: token, MaxAttempts: maxAttempts, Outcomes: outcomes})
	if err != nil {
		return 0, err
	}
	if res.Recorded == nil {
		return 0, errors.New("the write-back store function answered a record without a count")
	}
	return *res.Recorded, nil
}

// Backlog implements BacklogReader.
func (r RemoteStore) Backlog(ctx context.Context) (Backlog, error) {
	res, err := r.call(ctx, StoreRequest{Op: OpBacklog})
	if err != nil {
		return Backlog{}, err
	}
	if res.Backlog == nil {
		return Backlog{}, errors.New("the write-back store function answered without the backlog")
	}
	return *res.Backlog, nil
}

// BacklogReader reads the backlog: DBStore or RemoteStore.
type BacklogReader interface {
	Backlog(ctx context.Context) (Backlog, error)
}

// Backlog implements BacklogReader.
func (s DBStore) Backlog(ctx context.Context) (Backlog, error) {
	return ReadBacklog(ctx, s.DB, s.now())
}
