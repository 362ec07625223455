package bootstrap

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// backlogStore is a write-back store that also reads the backlog
// (writeback.DBStore, writeback.RemoteStore).
type backlogStore interface {
	writeback.Store
	writeback.BacklogReader
}

// Writeback is the writeback function's wiring: one run of the sender per
// invocation (the schedule's), then the backlog's gauges.
type Writeback struct {
	cfg      config.Writeback
	store    backlogStore
	fetchKey func(context.Context) (string, error)
	logger   *slog.Logger
	metrics  *metrics.Emitter
	// Pool is set when it stores directly (DATABASE_URL); close it.
	Pool *pgxpool.Pool

	mu     sync.Mutex
	key    string
	sender *writeback.Sender
}

// Close releases the pool, if any.
func (w *Writeback) Close() {
	if w.Pool != nil {
		w.Pool.Close()
	}
}

// NewWriteback fetches the Stripe API key (failing when it is missing, not
// a key, of the other mode than STRIPE_MODE, or, from Secrets Manager, not a
// restricted key) and builds the sender: its store is the writebackstore
// function (STORE_FUNCTION, a Lambda Invoke proven with this function's
// role) or the database (DATABASE_URL).
func NewWriteback(ctx context.Context, c config.Writeback, logger *slog.Logger, out io.Writer) (*Writeback, error) {
	sc, err := newStripeCaller(ctx, c.StripeCaller)
	if err != nil {
		return nil, err
	}
	w := &Writeback{cfg: c, logger: logger, fetchKey: sc.fetchKey}
	if sc.lambda != nil {
		w.store = writeback.RemoteStore{Lambda: sc.lambda, Function: c.StoreFunction, Prover: sc.prover}
	}
	key, err := w.fetchKey(ctx)
	if err != nil {
		return nil, err
	}
	if w.store == nil {
		if w.Pool, err = Pool(ctx, c.Database); err != nil {
			return nil, err
		}
		w.store = writeback.DBStore{DB: w.Pool}
	}
	w.metrics = callerMetrics(out, c.StripeCaller)
	if err := w.useKey(key); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func (w *Writeback) useKey(key string) error {
	cc := w.cfg.Client
	cc.Key = key
	api, err := writeback.NewClient(cc)
	if err != nil {
		return err
	}
	s, err := writeback.New(w.store, api, w.cfg.Sender, w.logger, w.metrics)
	if err != nil {
		return err
	}
	w.key, w.sender = key, s
	return nil
}

// Invoke runs the sender until nothing is due or the invocation's deadline
// is near, then emits the backlog's gauges (WritebacksPending,
// WritebacksOldestAgeSeconds, WritebacksParked). When Stripe refused the
// key, it fetches the key again for the next run (a rolled key works
// without a cold start). It fails when the store could not be used.
func (w *Writeback) Invoke(ctx context.Context) (writeback.Summary, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	runCtx := ctx
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithDeadline(ctx, d.Add(-w.cfg.DeadlineMargin))
		defer cancel()
	}
	sum, runErr := w.sender.Run(runCtx)
	if sum.KeyRefused {
		if key, err := w.fetchKey(ctx); err != nil {
			w.logger.ErrorContext(ctx, "fetching the Stripe API key again after Stripe refused it", "error", err.Error())
		} else if key != w.key {
			if err := w.useKey(key); err != nil {
				return sum, err
			}
			w.logger.InfoContext(ctx, "the Stripe API key changed; the next run uses the new one")
		}
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, blErr := writeback.EmitBacklog(bctx, w.store, w.metrics)
	return sum, errors.Join(runErr, blErr)
}

// NewWritebackStore builds the writebackstore function's handler: it serves
// only requests proven to come from the writeback function's role, verified
// with the STS endpoint this environment's SDK resolves.
func NewWritebackStore(ctx context.Context, c config.WritebackStore, logger *slog.Logger, out io.Writer) (*writeback.ProvenStore, *pgxpool.Pool, error) {
	verifier, pool, err := newStore(ctx, c.SenderRoleARN, c.Database)
	if err != nil {
		return nil, nil, err
	}
	return &writeback.ProvenStore{
		Store:   writeback.StoreHandler{Store: writeback.DBStore{DB: pool}},
		Proofs:  verifier,
		Metrics: Metrics(out, c.Common),
		Logger:  logger,
	}, pool, nil
}
