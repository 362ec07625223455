package config

import (
	"strings"
	"time"
)

// Local is the local runner's configuration: the webhook's, plus where to
// listen and how often to emulate the schedules.
type Local struct {
	Webhook        Webhook
	Worker         Worker
	ListenAddr     string
	WorkerInterval time.Duration
	WorkerTimeout  time.Duration
}

// LoadLocal reads LISTEN_ADDR (default 127.0.0.1:8080), WORKER_INTERVAL
// (default 2s: the local stand-in for the one-minute schedule) and
// WORKER_TIMEOUT (default 60s: the stand-in for the Lambda timeout), plus the
// webhook's and the worker's variables. DATABASE_URL is required.
func LoadLocal(env Env) (Local, error) {
	var p problems
	l := Local{ListenAddr: strings.TrimSpace(env("LISTEN_ADDR"))}
	if l.ListenAddr == "" {
		l.ListenAddr = "127.0.0.1:8080"
	}
	if env("DATABASE_URL") == "" {
		p.addf("DATABASE_URL is required locally (scripts/dev.sh sets it)")
	}
	l.WorkerInterval = p.duration(env, "WORKER_INTERVAL", 2*time.Second, 100*time.Millisecond, time.Hour)
	l.WorkerTimeout = p.duration(env, "WORKER_TIMEOUT", time.Minute, 5*time.Second, 15*time.Minute)
	var err error
	if l.Webhook, err = LoadWebhook(env); err != nil {
		p.addf("%v", err)
	}
	if l.Worker, err = LoadWorker(env); err != nil {
		p.addf("%v", err)
	}
	if l.Worker.Worker.DeadlineMargin >= l.WorkerTimeout {
		p.addf("WORKER_TIMEOUT=%s must be longer than DEADLINE_MARGIN=%s", l.WorkerTimeout, l.Worker.Worker.DeadlineMargin)
	}
	return l, p.err()
}
