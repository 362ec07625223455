// Command local runs the whole system on one machine: it applies the
// migrations, serves the webhook over plain HTTP exactly as the Function URL
// would present it, and runs the worker on a short interval in place of the
// EventBridge schedule. scripts/dev.sh starts it with a database.
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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/webhook"
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
	if err := applyMigrations(ctx, cfg.Webhook.Database.URL, logger); err != nil {
		return err
	}
	hook, err := bootstrap.NewWebhook(ctx, cfg.Webhook, logger, io.Discard) // EMF is for CloudWatch; the log says enough locally
	if err != nil {
		return err
	}
	defer hook.Pool.Close()
	w, workerPool, err := bootstrap.NewWorker(ctx, cfg.Worker, logger, io.Discard)
	if err != nil {
		return err
	}
	defer workerPool.Close()

	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listening on LISTEN_ADDR=%s: %w", cfg.ListenAddr, err)
	}
	srv := &http.Server{Handler: webhook.HTTPHandler(hook.Handler), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	for _, ep := range hook.Keyring.Endpoints() {
		fmt.Printf("listening on http://%s/%s (endpoint %q)\n", ln.Addr(), ep, ep)
	}

	ticker := time.NewTicker(cfg.WorkerInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			logger.Info("shutting down")
			return srv.Shutdown(shutdown)
		case err := <-serveErr:
			return err
		case <-ticker.C:
			runCtx, cancel := context.WithTimeout(ctx, cfg.WorkerTimeout)
			s, err := w.Run(runCtx)
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				logger.Error("worker run failed", "error", err)
			} else if s.Processed+s.Ignored+s.Failed > 0 {
				logger.Info("worker run", "summary", s)
			}
		}
	}
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
