package bootstrap

import (
	"context"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/reconcile"
)

// Reconciler is the reconciler's wiring.
type Reconciler struct {
	*reconcile.Reconciler
	// Pool is set when it stores directly (local, backfill); close it.
	Pool *pgxpool.Pool
}

// Close releases the pool, if any.
func (r *Reconciler) Close() {
	if r.Pool != nil {
		r.Pool.Close()
	}
}

// NewReconciler fetches the Stripe API key (failing when it is missing, not
// a key, or of the other mode than STRIPE_MODE; and again, once, when Stripe
// answers 401: ClientConfig.RefetchKey) and builds the reconciler:
// pages go to the store function (STORE_FUNCTION, a Lambda Invoke) or to the
// database (DATABASE_URL).
func NewReconciler(ctx context.Context, c config.Reconcile, logger *slog.Logger, out io.Writer) (*Reconciler, error) {
	sc, err := newStripeCaller(ctx, c.StripeCaller)
	if err != nil {
		return nil, err
	}
	key, err := sc.fetchKey(ctx)
	if err != nil {
		return nil, err
	}
	cc := c.Client
	cc.Key = key
	cc.RefetchKey = sc.fetchKey // once after a 401: a rolled key works without a cold start
	cc.Logger = logger
	client, err := reconcile.NewClient(cc)
	if err != nil {
		return nil, err
	}
	r := &Reconciler{}
	var sink reconcile.Sink
	if sc.lambda != nil {
		sink = reconcile.RemoteSink{Lambda: sc.lambda, Function: c.StoreFunction, Prover: sc.prover}
	} else {
		if r.Pool, err = Pool(ctx, c.Database); err != nil {
			return nil, err
		}
		sink = reconcile.DBSink{DB: r.Pool}
	}
	if r.Reconciler, err = reconcile.New(sink, client, c.Reconcile, logger, callerMetrics(out, c.StripeCaller)); err != nil {
		if r.Pool != nil {
			r.Pool.Close()
		}
		return nil, err
	}
	return r, nil
}

// NewReconcileStore builds the store function's handler: it serves only
// requests proven to come from the reconciler's role, verified with the STS
// endpoint this environment's SDK resolves (the STS VPC endpoint's private
// DNS name in the stack; AWS_ENDPOINT_URL_STS for a stand-in).
func NewReconcileStore(ctx context.Context, c config.ReconcileStore, logger *slog.Logger, out io.Writer) (*reconcile.ProvenStore, *pgxpool.Pool, error) {
	verifier, pool, err := newStore(ctx, c.ReconcilerRoleARN, c.Database)
	if err != nil {
		return nil, nil, err
	}
	return &reconcile.ProvenStore{
		Store:   reconcile.StoreHandler{Sink: reconcile.DBSink{DB: pool}, Endpoints: c.Endpoints},
		Proofs:  verifier,
		Metrics: Metrics(out, c.Common),
		Logger:  logger,
	}, pool, nil
}
