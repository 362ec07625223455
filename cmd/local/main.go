// Command local runs the system on one machine: it applies the migrations,
// serves the webhook over plain HTTP exactly as the Function URL would
// present it, and runs the worker and the purge on short intervals in place
// of their EventBridge schedules, the reconciler when STRIPE_API_KEY is
// set, and the write-back sender when WRITEBACKS is set (against
// STRIPE_API_BASE). LOCAL_COMPONENTS picks the parts (default all), so
// the fault-injection suite can run webhooks and workers as separate
// processes. scripts/dev.sh starts it with a database.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/wake"
	"github.com/stripe-inbox/inbox/internal/webhook"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

func main() {
	logger := bootstrap.Logger(os.Stderr)
	cfg, err := config.LoadLocal(os.Getenv)
	if err != nil {
		bootstrap.Fail(logger, "local runner cannot start", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, logger); err != nil {
		bootstrap.Fail(logger, "local runner failed", err)
	}
}

func run(ctx context.Context, cfg config.Local, logger *slog.Logger) error {
	if err := applyMigrations(ctx, os.Getenv("DATABASE_URL"), logger); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	// WORKER_WAKE=on: the webhook signals the worker loop after each new
	// receipt, as the deployed webhook invokes the worker (internal/wake).
	var wakes wake.Signal
	if cfg.WorkerWake {
		wakes = wake.NewSignal()
	}
	if cfg.Runs("webhook") {
		hook, err := bootstrap.NewWebhook(ctx, cfg.Webhook, logger, io.Discard) // EMF is for CloudWatch; the log says enough locally
		if err != nil {
			return err
		}
		defer hook.Pool.Close()
		if wakes != nil {
			hook.Handler.WakeWith(wakes)
		}
		ln, err := net.Listen("tcp", cfg.ListenAddr)
		if err != nil {
			return fmt.Errorf("cannot serve on LISTEN_ADDR=%s: %w", cfg.ListenAddr, err)
		}
		// POST /_eventbridge: the JSON EventBridge hands a target, through
		// the ingest function's handler (the local contract, see
		// internal/ingest.HTTPHandler); every other path is the webhook.
		eb, err := ingest.New(hook.Pool, cfg.EventBridge, logger, nil)
		if err != nil {
			return err
		}
		if wakes != nil {
			eb.WakeWith(wakes) // as the webhook: WORKER_WAKE=on
		}
		// (Not a ServeMux: it would clean and redirect paths the webhook
		// answers itself, as the Function URL does.)
		ebHTTP, hookHTTP := ingest.HTTPHandler(eb), webhook.HTTPHandler(hook.Handler)
		route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/_eventbridge" {
				ebHTTP.ServeHTTP(w, r)
				return
			}
			hookHTTP.ServeHTTP(w, r)
		})
		srv := &http.Server{Handler: route, ReadHeaderTimeout: 10 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			go func() {
				<-ctx.Done()
				shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = srv.Shutdown(shutdown)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
		for _, ep := range hook.Keyring.Endpoints() {
			fmt.Printf("listening on http://%s/%s (endpoint %q)\n", ln.Addr(), ep, ep)
		}
		if cfg.EventBridge.Default != "" {
			fmt.Printf("listening on http://%s/_eventbridge (EventBridge: sources %s* to endpoint %q)\n", ln.Addr(), ingest.PartnerPrefix, cfg.EventBridge.Default)
		} else {
			fmt.Printf("listening on http://%s/_eventbridge (EventBridge: %v, EVENTBRIDGE_SOURCES)\n", ln.Addr(), cfg.EventBridge.Exact)
		}
	}
	if cfg.Runs("worker") {
		w, pool, err := bootstrap.NewWorker(ctx, cfg.Worker, logger, io.Discard)
		if err != nil {
			return err
		}
		defer pool.Close()
		// OUTBOX_BUS set: the worker relays the outbox to EventBridge, or to
		// the stand-in AWS_ENDPOINT_URL_EVENTBRIDGE names.
		ocfg, err := config.LoadOutbox(os.Getenv)
		if err != nil {
			return err
		}
		if err := bootstrap.AttachRelay(ctx, w, pool, cfg.Worker, ocfg, logger, io.Discard); err != nil {
			return err
		}
		if ocfg.Enabled {
			fmt.Printf("outbox relay publishing to event bus %s (OUTBOX_BUS)\n", ocfg.Relay.Bus)
		}
		resident := cfg.Worker.Worker.PollInterval > 0
		concurrent := 1
		if resident {
			concurrent = maxResidentRuns
		}
		schedule(ctx, &wg, logger, "worker", cfg.WorkerInterval, cfg.WorkerTimeout, concurrent, wakes, func(runCtx context.Context) {
			s, err := w.Run(runCtx)
			if err != nil && ctx.Err() == nil {
				logger.Error("worker run failed", "error", err)
			} else if s.Processed+s.Ignored+s.IgnoredOtherMode+s.Failed > 0 {
				logger.Info("worker run", "summary", s)
			}
		})
		if wakes != nil {
			fmt.Println("worker woken by the webhook after each new receipt (WORKER_WAKE)")
		}
		if resident {
			fmt.Printf("worker running every %s, resident for %s of each run (WORKER_TIMEOUT - DEADLINE_MARGIN), polling every %s (POLL_INTERVAL), listening: %t (LISTEN), booking Stripe %s mode (STRIPE_MODE)\n",
				cfg.WorkerInterval, cfg.WorkerTimeout-cfg.Worker.Worker.DeadlineMargin, cfg.Worker.Worker.PollInterval, cfg.Worker.Worker.Listen, cfg.Worker.Worker.Mode)
		} else {
			fmt.Printf("worker running every %s, booking Stripe %s mode (STRIPE_MODE)\n", cfg.WorkerInterval, cfg.Worker.Worker.Mode)
		}
	}
	if cfg.Writeback.Enabled {
		if err := startWriteback(ctx, &wg, cfg, logger); err != nil {
			return err
		}
	}
	if cfg.Runs("purge") {
		p, pool, err := bootstrap.NewPurger(ctx, cfg.Purge, logger, io.Discard)
		if err != nil {
			return err
		}
		defer pool.Close()
		schedule(ctx, &wg, logger, "purge", cfg.PurgeInterval, cfg.PurgeTimeout, 1, nil, func(runCtx context.Context) {
			_, _ = p.Run(runCtx) // Run logs its summary or its error
		})
		fmt.Printf("purge running every %s (retention %s)\n", cfg.PurgeInterval, cfg.Purge.Purge.Retention)
	}
	if cfg.Runs(config.LocalReconcile) {
		r, err := bootstrap.NewReconciler(ctx, cfg.Reconcile, logger, io.Discard)
		if err != nil {
			return err
		}
		defer r.Close()
		// One run at a time, each until it has covered its window (no
		// Lambda timeout locally): the next tick waits for it.
		schedule(ctx, &wg, logger, "reconcile", cfg.ReconcileInterval, 24*time.Hour, 1, nil, func(runCtx context.Context) {
			s, err := r.Run(runCtx)
			if err != nil && ctx.Err() == nil {
				logger.Error("reconcile run failed", "error", err, "summary", s)
			} else if err == nil {
				logger.Info("reconcile run", "summary", s)
			}
		})
		rc := cfg.Reconcile
		fmt.Printf("reconciler running every %s against %s for endpoint %q (first window %s back, settle %s)\n",
			cfg.ReconcileInterval, rc.Client.BaseURL, rc.Reconcile.Endpoint, rc.Reconcile.Lookback, rc.Reconcile.Settle)
	}
	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case err := <-errs:
		return err
	}
	wg.Wait()
	return nil
}

// startWriteback runs the write-back sender (WRITEBACKS) every
// WRITEBACK_INTERVAL against STRIPE_API_BASE, on a small pool of its own:
// in the stack it is the writeback function with the writebackstore
// function in front of the database.
func startWriteback(ctx context.Context, wg *sync.WaitGroup, cfg config.Local, logger *slog.Logger) error {
	dbc := cfg.Worker.Database
	dbc.MaxConns = 2
	dbc.PreparedStatements = false
	pool, err := database.Open(ctx, dbc, nil)
	if err != nil {
		return fmt.Errorf("write-back sender: %w", err)
	}
	api, err := writeback.NewClient(cfg.Writeback.Client)
	if err != nil {
		pool.Close()
		return err
	}
	s, err := writeback.New(writeback.DBStore{DB: pool}, api, cfg.Writeback.Sender, logger, nil)
	if err != nil {
		pool.Close()
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		pool.Close()
	}()
	schedule(ctx, wg, logger, "writeback", cfg.Writeback.Interval, time.Minute, 1, nil, func(runCtx context.Context) {
		if _, err := s.Run(runCtx); err != nil && ctx.Err() == nil {
			logger.Error("write-back run failed", "error", err)
		}
	})
	fmt.Println(cfg.Writeback.String())
	return nil
}

// maxResidentRuns is how many resident worker runs may go on at once: the
// local stand-in for the worker's reserved concurrency in the stack
// (workerReservedConcurrency), which throttles an invocation beyond it. Each
// run holds connections of its own (a LISTEN connection taken out of the
// pool for good, a poller, its drainers), so unbounded runs (a run that
// overstays its timeout, say a poll stuck on a lock) would pile up and
// exhaust the pool and the database. Two is what the default WORKER_TIMEOUT
// needs: a run ends WORKER_INTERVAL + min(WORKER_INTERVAL/2, 5s) after its
// tick, so only the previous run is still going when the next one starts.
const maxResidentRuns = 2

// schedule stands in for an EventBridge rule: it invokes fn now and then
// every interval until ctx ends, each time with a context that ends after
// timeout, as a Lambda invocation's does. With concurrent > 1, each
// invocation starts on its tick even while previous ones still run, as
// EventBridge starts a Lambda while the previous invocation is still
// resident, but at most concurrent at once: a tick that finds that many
// running is skipped and logged, as a throttled invocation would be.
// Otherwise (concurrent <= 1) the next one waits for the previous to return.
// A receive from wakes (nil: none) starts a run as a tick does.
func schedule(ctx context.Context, wg *sync.WaitGroup, logger *slog.Logger, name string, interval, timeout time.Duration, concurrent int, wakes <-chan struct{}, fn func(context.Context)) {
	running := make(chan struct{}, max(concurrent, 1))
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if concurrent > 1 {
				select {
				case running <- struct{}{}:
					runCtx, cancel := context.WithTimeout(ctx, timeout)
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer func() { <-running }()
						defer cancel()
						fn(runCtx)
					}()
				default:
					logger.Warn("run skipped: the previous runs are still going", "component", name, "running", concurrent)
				}
			} else {
				runCtx, cancel := context.WithTimeout(ctx, timeout)
				fn(runCtx)
				cancel()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-wakes:
			}
		}
	}()
}

func applyMigrations(ctx context.Context, url string, logger *slog.Logger) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	res, err := migrate.Up(ctx, conn)
	if err != nil {
		return err
	}
	logger.Info("migrations", "applied", res.Applied, "current", res.Current)
	return nil
}
