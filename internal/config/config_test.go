package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/handlers"
)

func env(kv ...string) config.Env {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return config.MapEnv(m)
}

const localDB = "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"

func TestWebhookLocal(t *testing.T) {
	t.Parallel()
	c, err := config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a,whsec_b", "WEBHOOK_ENDPOINT", "connect"))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"connect": "whsec_a,whsec_b"}, c.Endpoints)
	require.False(t, c.FromSecretsManager)
	require.Equal(t, 5*time.Minute, c.SecretTTL)
	require.Equal(t, 2*time.Second, c.SecretFetchTimeout)
	require.Equal(t, 1<<20, c.Handler.MaxBodyBytes)
	require.EqualValues(t, 2, c.Database.MaxConns)
	require.False(t, c.Database.PreparedStatements, "the webhook must not pin RDS Proxy sessions")
	require.Equal(t, "webhook", c.MetricsDimensions["Service"])
}

func TestWebhookAWS(t *testing.T) {
	t.Parallel()
	arnB := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:billing-AbCdEf"
	arnC := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:connect-AbCdEf"
	c, err := config.LoadWebhook(env(
		"SIGNING_SECRET_ARNS", "billing="+arnB+", connect="+arnC,
		"DB_PROXY_HOST", "proxy.example", "DB_NAME", "inbox", "DB_USER", "inbox_app", "AWS_REGION", "eu-west-1",
		"METRICS_DIMENSIONS", "Stage=prod",
	))
	require.NoError(t, err)
	require.True(t, c.FromSecretsManager)
	require.Equal(t, map[string]string{"billing": arnB, "connect": arnC}, c.Endpoints)
	require.Equal(t, 5432, c.Database.ProxyPort)
	require.Equal(t, map[string]string{"Service": "webhook", "Stage": "prod"}, c.MetricsDimensions)
	c, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "SECRET_FETCH_TIMEOUT", "750ms"))
	require.NoError(t, err)
	require.Equal(t, 750*time.Millisecond, c.SecretFetchTimeout)
}

func TestWebhookErrorsSayWhatToFix(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		env  config.Env
		want []string
	}{
		"nothing set": {env(), []string{"no signing secret: set STRIPE_WEBHOOK_SECRET", "set DATABASE_URL (local) or DB_PROXY_HOST"}},
		"both secret sources": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "SIGNING_SECRET_ARNS", "billing=arn:aws:secretsmanager:x"),
			[]string{"not both"}},
		"secret not whsec":  {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "sk_test_123"), []string{"must start with whsec_"}},
		"bad endpoint name": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WEBHOOK_ENDPOINT", "Bill ing"), []string{"WEBHOOK_ENDPOINT"}},
		"arn list malformed": {env("DATABASE_URL", localDB, "SIGNING_SECRET_ARNS", "billing"),
			[]string{"must be endpoint=arn"}},
		"arn not secrets manager": {env("DATABASE_URL", localDB, "SIGNING_SECRET_ARNS", "billing=arn:aws:s3:::bucket"),
			[]string{"is not a Secrets Manager ARN"}},
		"endpoint twice": {env("DATABASE_URL", localDB, "SIGNING_SECRET_ARNS", "b=arn:aws:secretsmanager:x,b=arn:aws:secretsmanager:y"),
			[]string{"listed twice"}},
		"proxy without user": {env("DB_PROXY_HOST", "p", "STRIPE_WEBHOOK_SECRET", "whsec_a"), []string{"DB_PROXY_HOST needs DB_NAME, DB_USER and AWS_REGION"}},
		"url and proxy":      {env("DATABASE_URL", localDB, "DB_PROXY_HOST", "p", "STRIPE_WEBHOOK_SECRET", "whsec_a"), []string{"not both"}},
		"bad url":            {env("DATABASE_URL", "postgres://%zz", "STRIPE_WEBHOOK_SECRET", "whsec_a"), []string{"DATABASE_URL cannot be parsed"}},
		"bad numbers": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "MAX_BODY_BYTES", "10", "SECRET_TTL", "forever", "DB_MAX_CONNS", "0"),
			[]string{"MAX_BODY_BYTES=\"10\"", "SECRET_TTL=\"forever\"", "DB_MAX_CONNS=0: the pool needs from 1 to 100 connections"}},
		"fetch timeout not a duration": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "SECRET_FETCH_TIMEOUT", "2"),
			[]string{`SECRET_FETCH_TIMEOUT="2": must be a duration such as 30s or 5m, from 100ms to 5s (default 2s)`}},
		"fetch timeout too long": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "SECRET_FETCH_TIMEOUT", "30s"),
			[]string{`SECRET_FETCH_TIMEOUT="30s": must be a duration`}},
		"fetch timeout too short": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "SECRET_FETCH_TIMEOUT", "1ms"),
			[]string{`SECRET_FETCH_TIMEOUT="1ms": must be a duration`}},
		"bad dimensions": {env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "METRICS_DIMENSIONS", "Stage"), []string{"METRICS_DIMENSIONS"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.LoadWebhook(tc.env)
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestWorker(t *testing.T) {
	t.Parallel()
	c, err := config.LoadWorker(env("DATABASE_URL", localDB, "WORKER_CONCURRENCY", "8", "STRIPE_MODE", "live"))
	require.NoError(t, err)
	require.Equal(t, "live", c.Worker.Mode)
	require.Equal(t, 8, c.Worker.Concurrency)
	require.EqualValues(t, 9, c.Database.MaxConns, "one connection per drainer plus one")
	require.True(t, c.Database.PreparedStatements, "the worker caches its statements")
	require.Equal(t, 10, c.Worker.MaxAttempts)
	require.Equal(t, handlers.BookUnnamed, c.Handlers.UnnamedReleases, "a release the code has not named is booked when its shape holds")
	c, err = config.LoadWorker(env("DATABASE_URL", localDB, "STRIPE_MODE", "live", "STRIPE_UNNAMED_RELEASES", "hold"))
	require.NoError(t, err)
	require.Equal(t, handlers.HoldUnnamed, c.Handlers.UnnamedReleases)
}

func TestWorkerErrorsSayWhatToFix(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		env  config.Env
		want string
	}{
		"lease shorter than statement timeout": {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "LEASE", "10s", "STATEMENT_TIMEOUT", "30s"), "LEASE=10s must be longer than STATEMENT_TIMEOUT=30s"},
		"lease shorter than a claim's work":    {env("DATABASE_URL", localDB, "LEASE", "1m", "STATEMENT_TIMEOUT", "30s", "CLAIM_LIMIT", "4"), "CLAIM_LIMIT x STATEMENT_TIMEOUT"},
		"margin too short":                     {env("DATABASE_URL", localDB, "DEADLINE_MARGIN", "1s"), "DEADLINE_MARGIN=1s must be longer than STATEMENT_TIMEOUT=2s"},
		"too few connections":                  {env("DATABASE_URL", localDB, "WORKER_CONCURRENCY", "4", "DB_MAX_CONNS", "2"), "WORKER_CONCURRENCY+1 = 5"},
		"bad concurrency":                      {env("DATABASE_URL", localDB, "WORKER_CONCURRENCY", "0"), "WORKER_CONCURRENCY=0: must be from 1 to 64"},
		"backoff":                              {env("DATABASE_URL", localDB, "BACKOFF_BASE", "10m", "BACKOFF_CAP", "1m"), "need 0 < base <= cap"},
		"batch past the subtransaction cache":  {env("DATABASE_URL", localDB, "LEASE", "10m", "CLAIM_LIMIT", "100", "BATCH_SIZE", "65"), "BATCH_SIZE=65: must be at most 64"},
		"no stripe mode":                       {env("DATABASE_URL", localDB), `STRIPE_MODE is required: set it to "live" on the stage that books real money (prod) or "test" on every other stage`},
		"other stripe mode":                    {env("DATABASE_URL", localDB, "STRIPE_MODE", "production"), `STRIPE_MODE="production": must be "live" (the stage that books real money, prod) or "test"`},
		"poll interval too short":              {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "POLL_INTERVAL", "5ms"), "POLL_INTERVAL=5ms: must be 0 (return as soon as the inbox is empty; the schedule alone starts the work) or from 10ms to 1h0m0s"},
		"poll interval not a duration":         {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "POLL_INTERVAL", "fast"), `POLL_INTERVAL="fast": must be 0 (return as soon as the inbox is empty) or a duration`},
		"poll interval negative":               {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "POLL_INTERVAL", "-1s"), `POLL_INTERVAL="-1s"`},
		"listen not a switch":                  {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "LISTEN", "yes please"), `LISTEN="yes please": must be on or off (default off)`},
		"listen without polling":               {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "LISTEN", "on", "POLL_INTERVAL", "0"), "LISTEN=on needs POLL_INTERVAL > 0"},
		"unnamed releases":                     {env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "STRIPE_UNNAMED_RELEASES", "skip"), `STRIPE_UNNAMED_RELEASES="skip": must be "book"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.LoadWorker(tc.env)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestWorkerPollInterval(t *testing.T) {
	t.Parallel()
	c, err := config.LoadWorker(env("STRIPE_MODE", "test", "DATABASE_URL", localDB))
	require.NoError(t, err)
	require.Equal(t, 250*time.Millisecond, c.Worker.PollInterval, "resident by default")
	require.False(t, c.Worker.Listen, "no LISTEN unless asked (RDS Proxy, see infra/stack)")
	for _, zero := range []string{"0", "0s", "0ms"} {
		c, err = config.LoadWorker(env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "POLL_INTERVAL", zero))
		require.NoError(t, err)
		require.Zero(t, c.Worker.PollInterval, "POLL_INTERVAL=%s is the scheduled-only worker", zero)
	}
	c, err = config.LoadWorker(env("STRIPE_MODE", "test", "DATABASE_URL", localDB, "POLL_INTERVAL", "1s", "LISTEN", "on"))
	require.NoError(t, err)
	require.Equal(t, time.Second, c.Worker.PollInterval)
	require.True(t, c.Worker.Listen)
}

func TestWebhookNotify(t *testing.T) {
	t.Parallel()
	c, err := config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"))
	require.NoError(t, err)
	require.False(t, c.Handler.Notify)
	c, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "NOTIFY", "on"))
	require.NoError(t, err)
	require.True(t, c.Handler.Notify)
	_, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "NOTIFY", "sometimes"))
	require.ErrorContains(t, err, `NOTIFY="sometimes": must be on or off`)
}

func TestWebhookWake(t *testing.T) {
	t.Parallel()
	c, err := config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"))
	require.NoError(t, err)
	require.Empty(t, c.WakeFunction, "no wake unless the stack names the worker")
	require.Equal(t, time.Second, c.WakeTimeout)
	c, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a",
		"WAKE_FUNCTION", "StripeInbox-dev-worker", "WAKE_TIMEOUT", "500ms"))
	require.NoError(t, err)
	require.Equal(t, "StripeInbox-dev-worker", c.WakeFunction)
	require.Equal(t, 500*time.Millisecond, c.WakeTimeout)
	_, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WAKE_TIMEOUT", "30s"))
	require.ErrorContains(t, err, "WAKE_TIMEOUT")
}

// TestLocalResidentWorkerAlwaysHasAPoller: the local runner's defaults keep
// a poller live between runs at any WORKER_INTERVAL (the arithmetic of
// overlapping runs: timeout - margin > interval).
func TestLocalResidentWorkerAlwaysHasAPoller(t *testing.T) {
	t.Parallel()
	for _, interval := range []string{"", "200ms", "2s", "60s", "5m"} {
		c, err := config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WORKER_INTERVAL", interval, "DEADLINE_MARGIN", "40s"))
		require.NoError(t, err)
		require.Greater(t, c.WorkerTimeout-c.Worker.Worker.DeadlineMargin, c.WorkerInterval, "WORKER_INTERVAL=%s", interval)
		require.True(t, c.Worker.Worker.Listen, "the local worker listens")
		require.True(t, c.Webhook.Handler.Notify, "the local webhook notifies")
	}
	c, err := config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WORKER_INTERVAL", "60s"))
	require.NoError(t, err)
	require.Equal(t, 95*time.Second, c.WorkerTimeout, "60s + 5s overlap + the 30s margin")
	_, err = config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WORKER_INTERVAL", "60s", "WORKER_TIMEOUT", "60s"))
	require.ErrorContains(t, err, "WORKER_TIMEOUT=1m0s - DEADLINE_MARGIN=30s must be longer than WORKER_INTERVAL=1m0s")
	// The scheduled-only worker: neither notifies nor listens, and the
	// timeout stays as set.
	c, err = config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "POLL_INTERVAL", "0", "WORKER_INTERVAL", "60s"))
	require.NoError(t, err)
	require.False(t, c.Worker.Worker.Listen)
	require.False(t, c.Webhook.Handler.Notify)
	require.Equal(t, time.Minute, c.WorkerTimeout)
}

func TestLocal(t *testing.T) {
	t.Parallel()
	c, err := config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", c.ListenAddr)
	require.Equal(t, "test", c.Worker.Worker.Mode, "the local runner books test mode unless told otherwise")
	c, err = config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "STRIPE_MODE", "live"))
	require.NoError(t, err)
	require.Equal(t, "live", c.Worker.Worker.Mode)
	_, err = config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "STRIPE_MODE", "Live"))
	require.ErrorContains(t, err, `STRIPE_MODE="Live"`)
	_, err = config.LoadLocal(env("STRIPE_WEBHOOK_SECRET", "whsec_a"))
	require.ErrorContains(t, err, "DATABASE_URL is required locally")
}

func TestLocalWorkerWake(t *testing.T) {
	t.Parallel()
	c, err := config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"))
	require.NoError(t, err)
	require.False(t, c.WorkerWake, "off by default: the local runner's schedule as before")
	c, err = config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WORKER_WAKE", "on", "POLL_INTERVAL", "0"))
	require.NoError(t, err)
	require.True(t, c.WorkerWake)
	_, err = config.LoadLocal(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "WORKER_WAKE", "on", "LOCAL_COMPONENTS", "webhook"))
	require.ErrorContains(t, err, "WORKER_WAKE=on: the webhook wakes the worker, so LOCAL_COMPONENTS must list both")
}

func TestMetricsPublish(t *testing.T) {
	t.Parallel()
	c, err := config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a"))
	require.NoError(t, err)
	require.Nil(t, c.MetricsPublish, "unset: every metric is published")
	c, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "METRICS_PUBLISH", "Rejected, StoreFailed"))
	require.NoError(t, err)
	require.Equal(t, []string{"Rejected", "StoreFailed"}, c.MetricsPublish)
	c, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "METRICS_PUBLISH", "none"))
	require.NoError(t, err)
	require.Equal(t, []string{}, c.MetricsPublish)
	_, err = config.LoadWebhook(env("DATABASE_URL", localDB, "STRIPE_WEBHOOK_SECRET", "whsec_a", "METRICS_PUBLISH", "Rejected;Received"))
	require.ErrorContains(t, err, "METRICS_PUBLISH")
}
