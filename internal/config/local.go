package config

import (
	"slices"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/ingest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// Local is the local runner's configuration: which parts to run, the
// webhook's and the worker's settings, where to listen, and how often to
// emulate the schedules.
type Local struct {
	Components     []string // of "webhook", "worker", "purge"
	Webhook        Webhook
	Worker         Worker
	Purge          Purge
	ListenAddr     string
	WorkerInterval time.Duration
	WorkerTimeout  time.Duration
	PurgeInterval  time.Duration
	PurgeTimeout   time.Duration
	// Reconcile and ReconcileInterval: the reconciler, which runs when
	// STRIPE_API_KEY is set (see loadLocalReconcile).
	Reconcile         Reconcile
	ReconcileInterval time.Duration
	// WorkerWake (WORKER_WAKE=on; default off) makes the local webhook
	// start a worker run after each new receipt commits, as the deployed
	// webhook does with an asynchronous Invoke (internal/wake); the
	// WORKER_INTERVAL schedule keeps running beside it. Needs both the
	// webhook and the worker in LOCAL_COMPONENTS.
	WorkerWake bool
	// EventBridge maps sources to endpoints for POST /_eventbridge, served
	// with the webhook (localEventBridge).
	EventBridge ingest.Sources
	// Writeback: the write-back sender, which runs with the worker when
	// WRITEBACKS is set (see loadLocalWriteback).
	Writeback LocalWriteback
}

// LocalWorkerTimeout is the local runner's default WORKER_TIMEOUT for a
// resident worker: each run polls for WORKER_INTERVAL plus an overlap (half
// the interval, at most 5s) before its margin, so consecutive runs overlap.
func LocalWorkerTimeout(interval, margin time.Duration) time.Duration {
	return interval + min(interval/2, 5*time.Second) + margin
}

// Runs reports whether component c is enabled.
func (l Local) Runs(c string) bool { return slices.Contains(l.Components, c) }

// LocalComponents are what LOCAL_COMPONENTS may list.
var LocalComponents = []string{"webhook", "worker", "purge"}

// LoadLocal reads LOCAL_COMPONENTS (default all: webhook,worker,purge),
// LISTEN_ADDR (default 127.0.0.1:8080), WORKER_INTERVAL (default 2s: the
// local stand-in for the one-minute schedule), WORKER_TIMEOUT (the stand-in
// for the Lambda timeout; default 60s, or for a resident worker
// LocalWorkerTimeout, so that runs overlap), NOTIFY and LISTEN (default on
// while POLL_INTERVAL is not 0), PURGE_INTERVAL (default 1m: the
// stand-in for the daily schedule), PURGE_TIMEOUT (default 60s) and
// STRIPE_MODE (default test: the mode the local worker books), plus the
// variables of each component it runs. DATABASE_URL is required. Locally one
// environment feeds every component, so DEADLINE_MARGIN is shared by the
// worker and the purge.
func LoadLocal(env Env) (Local, error) {
	var p problems
	l := Local{ListenAddr: strings.TrimSpace(env("LISTEN_ADDR"))}
	if l.ListenAddr == "" {
		l.ListenAddr = "127.0.0.1:8080"
	}
	l.Components = slices.Clone(LocalComponents)
	if raw := strings.TrimSpace(env("LOCAL_COMPONENTS")); raw != "" {
		l.Components = nil
		for _, c := range strings.Split(raw, ",") {
			c = strings.TrimSpace(c)
			if !slices.Contains(LocalComponents, c) && c != LocalReconcile {
				p.addf("LOCAL_COMPONENTS=%q: %q is not one of %s", raw, c, strings.Join(LocalComponents, ", "))
				continue
			}
			l.Components = append(l.Components, c)
		}
	}
	if env("DATABASE_URL") == "" {
		p.addf("DATABASE_URL is required locally (scripts/dev.sh sets it)")
	}
	l.WorkerInterval = p.durationIn(env, "WORKER_INTERVAL", 2*time.Second, 10*time.Millisecond, time.Hour)
	workerTimeoutSet := strings.TrimSpace(env("WORKER_TIMEOUT")) != ""
	l.WorkerTimeout = p.durationIn(env, "WORKER_TIMEOUT", time.Minute, 2*time.Second, 15*time.Minute)
	l.PurgeInterval = p.durationIn(env, "PURGE_INTERVAL", time.Minute, 10*time.Millisecond, 24*time.Hour)
	l.PurgeTimeout = p.durationIn(env, "PURGE_TIMEOUT", time.Minute, 2*time.Second, 15*time.Minute)
	var err error
	// Locally the webhook notifies and the worker listens unless told
	// otherwise (NOTIFY, LISTEN): effects within a moment of the receipt.
	// Without a resident worker (POLL_INTERVAL=0) nobody listens.
	resident := true
	if v := strings.TrimSpace(env("POLL_INTERVAL")); v != "" {
		d, err := time.ParseDuration(v)
		resident = !(v == "0" || (err == nil && d == 0))
	}
	localEnv := func(k string) string {
		v := env(k)
		if (k == "NOTIFY" || k == "LISTEN") && strings.TrimSpace(v) == "" && resident {
			return "on"
		}
		return v
	}
	if l.Runs("webhook") {
		if l.Webhook, err = LoadWebhook(localEnv); err != nil {
			p.addf("%v", err)
		}
		l.EventBridge = p.localEventBridge(env)
	}
	if l.Runs("worker") {
		// Locally the worker books test mode unless STRIPE_MODE says otherwise.
		wenv := func(k string) string {
			if v := localEnv(k); k != "STRIPE_MODE" || strings.TrimSpace(v) != "" {
				return v
			}
			return worker.ModeTest
		}
		if l.Worker, err = LoadWorker(wenv); err != nil {
			p.addf("%v", err)
		}
		wc := l.Worker.Worker
		if wc.PollInterval > 0 {
			// A resident worker: each "invocation" stays until
			// WORKER_TIMEOUT - DEADLINE_MARGIN, and the next starts every
			// WORKER_INTERVAL, overlapping it as EventBridge's next run
			// overlaps a Lambda still running. By default the timeout is
			// chosen so that they overlap and a poller is always live,
			// whatever WORKER_INTERVAL (60s, the deployed cadence, too).
			if !workerTimeoutSet {
				l.WorkerTimeout = LocalWorkerTimeout(l.WorkerInterval, wc.DeadlineMargin)
			}
			if l.WorkerTimeout-wc.DeadlineMargin <= l.WorkerInterval {
				p.addf("WORKER_TIMEOUT=%s - DEADLINE_MARGIN=%s must be longer than WORKER_INTERVAL=%s, or the resident worker leaves gaps with no poller between runs (leave WORKER_TIMEOUT unset for %s, or set POLL_INTERVAL=0 for the scheduled-only worker)",
					l.WorkerTimeout, wc.DeadlineMargin, l.WorkerInterval, LocalWorkerTimeout(l.WorkerInterval, wc.DeadlineMargin))
			}
		}
		if wc.DeadlineMargin >= l.WorkerTimeout {
			p.addf("WORKER_TIMEOUT=%s must be longer than DEADLINE_MARGIN=%s", l.WorkerTimeout, wc.DeadlineMargin)
		}
	}
	l.WorkerWake = p.onOff(env, "WORKER_WAKE", false)
	if l.WorkerWake && (!l.Runs("webhook") || !l.Runs("worker")) {
		p.addf("WORKER_WAKE=on: the webhook wakes the worker, so LOCAL_COMPONENTS must list both (it lists %s)", strings.Join(l.Components, ","))
	}
	if l.Runs("purge") {
		if l.Purge, err = LoadPurge(env); err != nil {
			p.addf("%v", err)
		}
		if l.Purge.Purge.DeadlineMargin >= l.PurgeTimeout {
			p.addf("PURGE_TIMEOUT=%s must be longer than DEADLINE_MARGIN=%s", l.PurgeTimeout, l.Purge.Purge.DeadlineMargin)
		}
	}
	p.loadLocalReconcile(env, &l)
	p.loadLocalWriteback(env, &l)
	return l, p.err()
}
