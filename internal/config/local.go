package config

import (
	"slices"
	"strings"
	"time"

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
}

// Runs reports whether component c is enabled.
func (l Local) Runs(c string) bool { return slices.Contains(l.Components, c) }

// LocalComponents are what LOCAL_COMPONENTS may list.
var LocalComponents = []string{"webhook", "worker", "purge"}

// LoadLocal reads LOCAL_COMPONENTS (default all: webhook,worker,purge),
// LISTEN_ADDR (default 127.0.0.1:8080), WORKER_INTERVAL (default 2s: the
// local stand-in for the one-minute schedule), WORKER_TIMEOUT (default 60s:
// the stand-in for the Lambda timeout), PURGE_INTERVAL (default 1m: the
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
			if !slices.Contains(LocalComponents, c) {
				p.addf("LOCAL_COMPONENTS=%q: %q is not one of %s", raw, c, strings.Join(LocalComponents, ", "))
				continue
			}
			l.Components = append(l.Components, c)
		}
	}
	if env("DATABASE_URL") == "" {
		p.addf("DATABASE_URL is required locally (scripts/dev.sh sets it)")
	}
	l.WorkerInterval = p.duration(env, "WORKER_INTERVAL", 2*time.Second, 10*time.Millisecond, time.Hour)
	l.WorkerTimeout = p.duration(env, "WORKER_TIMEOUT", time.Minute, 2*time.Second, 15*time.Minute)
	l.PurgeInterval = p.duration(env, "PURGE_INTERVAL", time.Minute, 10*time.Millisecond, 24*time.Hour)
	l.PurgeTimeout = p.duration(env, "PURGE_TIMEOUT", time.Minute, 2*time.Second, 15*time.Minute)
	var err error
	if l.Runs("webhook") {
		if l.Webhook, err = LoadWebhook(env); err != nil {
			p.addf("%v", err)
		}
	}
	if l.Runs("worker") {
		// Locally the worker books test mode unless STRIPE_MODE says otherwise.
		wenv := func(k string) string {
			if v := env(k); k != "STRIPE_MODE" || strings.TrimSpace(v) != "" {
				return v
			}
			return worker.ModeTest
		}
		if l.Worker, err = LoadWorker(wenv); err != nil {
			p.addf("%v", err)
		}
		if l.Worker.Worker.DeadlineMargin >= l.WorkerTimeout {
			p.addf("WORKER_TIMEOUT=%s must be longer than DEADLINE_MARGIN=%s", l.WorkerTimeout, l.Worker.Worker.DeadlineMargin)
		}
	}
	if l.Runs("purge") {
		if l.Purge, err = LoadPurge(env); err != nil {
			p.addf("%v", err)
		}
		if l.Purge.Purge.DeadlineMargin >= l.PurgeTimeout {
			p.addf("PURGE_TIMEOUT=%s must be longer than DEADLINE_MARGIN=%s", l.PurgeTimeout, l.Purge.Purge.DeadlineMargin)
		}
	}
	return l, p.err()
}
