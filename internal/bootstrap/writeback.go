package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/secrets"
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
	fetch := secrets.Literal
	w := &Writeback{cfg: c, logger: logger}
	if c.APIKeyFromSecretsManager || c.StoreFunction != "" {
		cfg, err := awsConfig(ctx)
		if err != nil {
			return nil, err
		}
		if c.APIKeyFromSecretsManager {
			fetch = secrets.SecretsManager(secretsmanager.NewFromConfig(cfg))
		}
		if c.StoreFunction != "" {
			// Each request to the store function carries a presigned
			// sts:GetCallerIdentity made with this function's role.
			w.store = writeback.RemoteStore{Lambda: lambda.NewFromConfig(cfg), Function: c.StoreFunction, Prover: invokeproof.NewSigner(cfg)}
		}
	}
	w.fetchKey = func(ctx context.Context) (string, error) {
		key, mode, err := secrets.FetchAPIKey(ctx, fetch, c.APIKeyRef, c.SecretFetchTimeout)
		if err != nil {
			return "", err
		}
		if c.APIKeyFromSecretsManager {
			// In AWS only a restricted key: the function needs Customers:
			// Write, nothing else. (A local run may use any test key.)
			if err := secrets.CheckRestricted(key); err != nil {
				return "", fmt.Errorf("the Stripe API key's secret: %w", err)
			}
		}
		if c.Mode != "" && mode != c.Mode {
			return "", fmt.Errorf("the Stripe API key is a %s-mode key but STRIPE_MODE=%s: store a key of the mode this deployment books", mode, c.Mode)
		}
		return key, nil
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
	w.metrics = metrics.New(out, c.MetricsNamespace, c.MetricsDimensions)
	if c.MetricsPublish != nil {
		w.metrics.Publish(c.MetricsPublish)
	}
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
	admit, err := invokeproof.Role(c.SenderRoleARN)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := awsConfig(ctx)
	if err != nil {
		return nil, nil, err
	}
	endpoint, err := invokeproof.Endpoint(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	verifier, err := invokeproof.NewVerifier(endpoint, admit, nil)
	if err != nil {
		return nil, nil, err
	}
	pool, err := Pool(ctx, c.Database)
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
