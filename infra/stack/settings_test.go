package stack

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

func lookup(m map[string]any) func(string) any { return func(k string) any { return m[k] } }

func TestSettingsDefaults(t *testing.T) {
	t.Parallel()

	s, err := SettingsFromContext(lookup(nil))
	require.NoError(t, err)
	require.Equal(t, Settings{
		Stage:                      "dev",
		DBInstanceType:             "t4g.micro",
		DBStorageGiB:               20,
		MultiAZ:                    false,
		RetentionDays:              30,
		LogRetentionDays:           30,
		Reconcile:                  true,
		ReconcileSchedule:          "rate(15 minutes)",
		ReconcileEndpoint:          "billing",
		WorkerSchedule:             "rate(1 minute)",
		PurgeSchedule:              "cron(15 3 * * ? *)",
		Endpoints:                  []string{"billing"},
		OutboxRelay:                true,
		BacklogAgeAlarm:            10 * time.Minute,
		WebhookReservedConcurrency: 20,
		DBConnectionsAlarm:         80,
		MetricsNamespace:           "StripeInbox",
		StripeMode:                 "test",
		RetireLegacyAppRole:        true,
		ScrubPayloadAfterDays:      7,
		CloudTrailDataEvents:       false,
		WorkerWake:                 true,
		FunctionURL:                true,
		WorkerTimeout:              100 * time.Second,
		WorkerReservedConcurrency:  3,
		StripeAPIVersion:           stripeevent.DefaultAPIVersion,
		UnnamedAPIReleases:         "book",
		AssetsDir:                  filepath.Join("..", "build"),
	}, s)
	require.Equal(t, "StripeInbox-dev", s.StackName())

	p, err := SettingsFromContext(lookup(map[string]any{"stage": "prod"}))
	require.NoError(t, err)
	require.True(t, p.Protected())
	require.True(t, p.MultiAZ)
	require.Equal(t, 90, p.LogRetentionDays)
	require.True(t, p.CloudTrailDataEvents)
	require.Equal(t, "live", p.StripeMode, "prod books live money by default")

	// The protection follows the money, not the name.
	for _, tc := range []struct {
		context   map[string]any
		protected bool
	}{
		{map[string]any{"stage": "production", "stripeMode": "live"}, true},
		{map[string]any{"stage": "eu", "stripeMode": "live"}, true},
		{map[string]any{"stage": "prod", "stripeMode": "test"}, false},
		{map[string]any{"stage": "staging"}, false},
	} {
		s, err := SettingsFromContext(lookup(tc.context))
		require.NoError(t, err, tc.context)
		require.Equal(t, tc.protected, s.Protected(), tc.context)
		require.Equal(t, tc.protected, s.MultiAZ, tc.context)
		require.Equal(t, tc.protected, s.CloudTrailDataEvents, tc.context)
		require.Equal(t, map[bool]int{true: 90, false: 30}[tc.protected], s.LogRetentionDays, tc.context)
	}
}

func TestSettingsStripeMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		context map[string]any
		want    string
	}{
		{map[string]any{"stage": "prod"}, "live"},
		{map[string]any{"stage": "staging"}, "test"},
		{map[string]any{"stage": "prod", "stripeMode": "test"}, "test"},
		{map[string]any{"stage": "staging", "stripeMode": " live "}, "live"},
	} {
		s, err := SettingsFromContext(lookup(tc.context))
		require.NoError(t, err, tc.context)
		require.Equal(t, tc.want, s.StripeMode, tc.context)
	}
	for _, bad := range []any{"Live", "livemode", "true", true} {
		_, err := SettingsFromContext(lookup(map[string]any{"stripeMode": bad}))
		require.ErrorContains(t, err, "stripeMode=", bad)
	}
	_, err := SettingsFromContext(lookup(map[string]any{"stripeMode": "production"}))
	require.ErrorContains(t, err, `stripeMode="production": must be live`)
}

func TestSettingsFromCommandLineAndCdkJSON(t *testing.T) {
	t.Parallel()

	// -c values arrive as strings.
	s, err := SettingsFromContext(lookup(map[string]any{
		"stage": "staging", "endpoints": "billing, connect", "nat": "true", "multiAz": "true",
		"retentionDays": "45", "backlogAgeAlarm": "15m", "webhookReservedConcurrency": "50",
		"alarmEmail": "ops@example.com", "dbInstanceType": "m7g.large",
	}))
	require.NoError(t, err)
	require.Equal(t, []string{"billing", "connect"}, s.Endpoints)
	require.True(t, s.NAT)
	require.True(t, s.MultiAZ)
	require.Equal(t, 45, s.RetentionDays)
	require.Equal(t, 15*time.Minute, s.BacklogAgeAlarm)
	require.Equal(t, 50, s.WebhookReservedConcurrency)

	// cdk.json holds typed JSON.
	s, err = SettingsFromContext(lookup(map[string]any{
		"endpoints": []any{"billing", "connect-v2"}, "nat": false, "retentionDays": 10.0,
	}))
	require.NoError(t, err)
	require.Equal(t, []string{"billing", "connect-v2"}, s.Endpoints)
	require.Equal(t, 10, s.RetentionDays)

	s, err = SettingsFromContext(lookup(map[string]any{"endpoints": `["a","b"]`}))
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, s.Endpoints)
}

func TestSettingsRejectInvalidContext(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		context map[string]any
		want    string
	}{
		{"retention below Stripe's retry window", map[string]any{"retentionDays": "3"}, "retentionDays=3: must be a whole number from 4"},
		{"stage with capitals", map[string]any{"stage": "Prod"}, `stage="Prod"`},
		{"endpoint with a slash", map[string]any{"endpoints": "billing,con/nect"}, `"con/nect" must be lower-case`},
		{"no endpoints", map[string]any{"endpoints": []any{}}, "at least one endpoint"},
		{"endpoints that collide", map[string]any{"endpoints": "a-b,a_b"}, "are the same name"},
		{"nat not a bool", map[string]any{"nat": "yes please"}, "nat=yes please: must be true or false"},
		{"bad alarm e-mail", map[string]any{"alarmEmail": "ops"}, `alarmEmail="ops"`},
		{"bad schedule", map[string]any{"workerSchedule": "every minute"}, "workerSchedule"},
		{"backlog alarm too short", map[string]any{"backlogAgeAlarm": "30s"}, "backlogAgeAlarm=30s"},
		{"instance type with db. prefix", map[string]any{"dbInstanceType": "db.t4g.micro"}, "without the db. prefix"},
		{"log retention CloudWatch lacks", map[string]any{"logRetentionDays": "31"}, "logRetentionDays=31"},
		{"AWS namespace", map[string]any{"metricsNamespace": "AWS/Lambda"}, "metricsNamespace"},
		{"reserved concurrency zero", map[string]any{"webhookReservedConcurrency": 0.0}, "webhookReservedConcurrency=0"},
		{"retire not a bool", map[string]any{"retireLegacyAppRole": "inbox_app"}, "retireLegacyAppRole=inbox_app: must be true or false (default true)"},
		{"resident worker leaves a gap", map[string]any{"workerTimeout": "90s", "workerPollInterval": "250ms"},
			"workerTimeout=1m30s: a resident worker polls until the timeout minus its DEADLINE_MARGIN (30s), which must be at least 5s longer than the schedule's period (rate(1 minute) = 1m0s)"},
		{"overlap shorter than a cold start", map[string]any{"workerTimeout": "91s", "workerPollInterval": "250ms"}, "workerTimeout=1m31s: a resident worker polls until"},
		{"gap with a slower schedule", map[string]any{"workerSchedule": "rate(5 minutes)", "workerTimeout": "5m", "workerReservedConcurrency": "1", "workerPollInterval": "250ms"}, "set workerTimeout to at least 5m35s"},
		{"too few reserved for the overlap", map[string]any{"workerReservedConcurrency": "2"}, "workerReservedConcurrency=2: invocations started every 1m0s that may run 1m40s, and start up to 1m0s late, overlap up to 3 at a time; reserve at least 3"},
		{"timeout within the margin", map[string]any{"workerTimeout": "30s", "workerPollInterval": "0"}, "workerTimeout=30s must be longer than the worker's DEADLINE_MARGIN (30s)"},
		{"poll interval too short", map[string]any{"workerPollInterval": "1ms"}, "workerPollInterval=1ms: must be 0 (off) or a duration such as 250ms"},
		{"poll interval not a duration", map[string]any{"workerPollInterval": "fast"}, "workerPollInterval=fast"},
		{"latency alarm not a duration", map[string]any{"latencyP99Alarm": "3"}, "latencyP99Alarm=3"},
		{"listen not a bool", map[string]any{"workerListen": "on"}, "workerListen=on: must be true or false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := SettingsFromContext(lookup(tc.context))
			require.ErrorContains(t, err, "invalid CDK context")
			require.ErrorContains(t, err, tc.want)
		})
	}

	// All problems are reported at once.
	_, err := SettingsFromContext(lookup(map[string]any{"retentionDays": "1", "nat": "maybe"}))
	require.ErrorContains(t, err, "retentionDays")
	require.ErrorContains(t, err, "nat")
}

func TestSettingsWorkerTiming(t *testing.T) {
	t.Parallel()
	// The scheduled-only worker may keep any timeout past its margin.
	s, err := SettingsFromContext(lookup(map[string]any{"workerPollInterval": "0", "workerTimeout": "60s"}))
	require.NoError(t, err)
	require.Zero(t, s.WorkerPollInterval)
	// A cron schedule has no period to check against.
	_, err = SettingsFromContext(lookup(map[string]any{"workerSchedule": "cron(* * * * ? *)", "workerTimeout": "45s"}))
	require.NoError(t, err)
	s, err = SettingsFromContext(lookup(map[string]any{"workerPollInterval": "100ms", "latencyP99Alarm": "10s", "workerListen": "true"}))
	require.NoError(t, err)
	require.Equal(t, 100*time.Millisecond, s.WorkerPollInterval)
	require.Equal(t, 10*time.Second, s.LatencyP99Alarm)
	require.True(t, s.WorkerListen)
	for expr, want := range map[string]time.Duration{"rate(1 minute)": time.Minute, "rate(2 minutes)": 2 * time.Minute, "rate(1 hour)": time.Hour, "rate(3 days)": 72 * time.Hour} {
		got, ok := SchedulePeriod(expr)
		require.True(t, ok, expr)
		require.Equal(t, want, got, expr)
	}
	_, ok := SchedulePeriod("cron(15 3 * * ? *)")
	require.False(t, ok)
}

func TestCheckAssets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := Settings{AssetsDir: dir}
	err := s.CheckAssets()
	require.ErrorContains(t, err, "run scripts/build.sh")
	require.ErrorContains(t, err, filepath.Join(dir, "webhook", "bootstrap"))

	for _, name := range Functions {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, name), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name, "bootstrap"), []byte("x"), 0o755))
	}
	require.NoError(t, s.CheckAssets())
}

func TestProxyName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "stripeinbox-dev-proxy", ProxyName("StripeInbox-dev"))
	require.Equal(t, "inbox-9-proxy", ProxyName("9--"))
	long := ProxyName("StripeInbox-a-very-long-stage-name-that-goes-on-and-on-and-on-forever")
	require.LessOrEqual(t, len(long), 63)
	require.NotContains(t, long, "--")
}

func TestOutputID(t *testing.T) {
	t.Parallel()
	require.Equal(t, "Billing", OutputID("billing"))
	require.Equal(t, "ConnectV2", OutputID("connect-v2"))
	require.Equal(t, "EuBilling", OutputID("eu_billing"))
}
