package stack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// Settings are the deployment's knobs. Every field comes from a CDK context
// key (cdk.json "context", or -c key=value on the command line); the key is
// named in the field's comment, with its default.
type Settings struct {
	// Stage names the deployment (stage; default dev). It is part of the
	// stack name and the Stage metric dimension. Data protection follows
	// StripeMode, not this name (see Protected); "prod" only makes live the
	// default mode.
	Stage string
	// DBInstanceType is the RDS instance class without the "db." prefix
	// (dbInstanceType; default t4g.micro).
	DBInstanceType string
	// DBStorageGiB is the initial allocated storage (dbStorageGiB; default
	// 20); storage autoscaling may grow it to 5x.
	DBStorageGiB int
	// MultiAZ runs a standby in the second AZ (multiAz; default true when
	// stripeMode=live, false otherwise).
	MultiAZ bool
	// AlarmEmail, when set, subscribes that address to the alarm topic
	// (alarmEmail; default none).
	AlarmEmail string
	// RetentionDays is how long processed receipts are kept before the
	// purge deletes them (retentionDays; default 30, at least 4 so a
	// receipt outlives Stripe's 3-day retry window).
	RetentionDays int
	// LogRetentionDays is the functions' log retention (logRetentionDays;
	// default 90 when stripeMode=live, 30 otherwise; one of CloudWatch's
	// values).
	LogRetentionDays int
	// WorkerSchedule and PurgeSchedule are EventBridge schedule expressions
	// (workerSchedule; default rate(1 minute). purgeSchedule; default
	// cron(15 3 * * ? *), daily at 03:15 UTC).
	WorkerSchedule string
	PurgeSchedule  string
	// Endpoints are the Stripe webhook endpoints, each with its own signing
	// secret and URL path (endpoints; default ["billing"]; a JSON array or
	// a comma-separated string).
	Endpoints []string
	// NAT gives the functions a NAT gateway and IPv4 internet egress (nat;
	// default false). Nothing in the project needs it: the functions reach
	// AWS over IPv6 (network()) and the database inside the VPC.
	NAT bool
	// BacklogAgeAlarm is the age of the oldest unprocessed receipt that
	// raises the backlog alarm (backlogAgeAlarm; default 10m).
	BacklogAgeAlarm time.Duration
	// WebhookReservedConcurrency caps concurrent webhook invocations, which
	// bounds the connections they open (webhookReservedConcurrency; default
	// 20).
	WebhookReservedConcurrency int
	// DBConnectionsAlarm is the DatabaseConnections count that raises an
	// alarm (dbConnectionsAlarm; default 80, about 80% of a t4g.micro's
	// max_connections; raise it with the instance size).
	DBConnectionsAlarm int
	// MetricsNamespace is the CloudWatch namespace of the functions' EMF
	// metrics (metricsNamespace; default StripeInbox).
	MetricsNamespace string
	// StripeMode is the Stripe mode this deployment books (stripeMode;
	// "live" or "test"; default live for stage prod, test otherwise). It
	// becomes STRIPE_MODE of the worker: events of the other mode are stored
	// and marked processed, never booked. live turns on the data protection
	// (Protected), whatever the stage's name.
	StripeMode string
	// RetireLegacyAppRole retires inbox_app, the database role the
	// functions of releases before the per-function roles shared: the
	// migrate step strips it and makes it NOLOGIN, no role may connect as
	// it, and its secret leaves the proxy and the stack. It is the default;
	// keepLegacyAppRole=true (false by default) turns it off for exactly
	// one deploy: the upgrade from the shared-role release, while
	// CloudFormation replaces (or rolls back to) functions that log in as
	// inbox_app. That deploy keeps inbox_app working as that release left it
	// (a database without it never gets it); the next deploy, without the
	// setting, retires it. The migrate step refuses to retire the role while
	// the functions' own roles do not exist yet, so forgetting the setting
	// fails the upgrade (and rolls it back) rather than locking the running
	// functions out. retireLegacyAppRole=true, the former opt-in, is
	// accepted and changes nothing.
	RetireLegacyAppRole bool
	// WorkerPollInterval makes each scheduled worker invocation resident
	// (workerPollInterval; default 0: each run returns once the inbox is
	// empty; 250ms keeps a poller live, the former default, about $10 a
	// month more). It becomes the worker's POLL_INTERVAL.
	WorkerPollInterval time.Duration
	// WorkerWake makes the webhook start a worker run after each new
	// receipt commits, with an asynchronous Invoke (workerWake; default
	// true; internal/wake). With it the worker need not be resident for
	// sub-second receipt-to-effect; the schedule stays as the safety net.
	// The worker's reserved concurrency bounds the runs a burst starts.
	WorkerWake bool
	// WorkerTimeout is the worker function's timeout (workerTimeout;
	// default 100s). A resident invocation polls until WorkerTimeout -
	// WorkerDeadlineMargin (70s), so with rate(1 minute) consecutive
	// invocations overlap by 10s and a poller is always live; the overlap
	// also absorbs EventBridge's delivery jitter. Billed time per invocation
	// is about that 70s, not the timeout.
	WorkerTimeout time.Duration
	// WorkerReservedConcurrency reserves (and caps) concurrent worker
	// invocations (workerReservedConcurrency; default 3): two overlap at
	// every tick, one more covers a late tick. Each holds up to
	// WORKER_CONCURRENCY+2 proxy connections. Must be at least
	// ceil(workerTimeout / schedule period), or ticks are throttled.
	WorkerReservedConcurrency int
	// WorkerListen turns on LISTEN in the worker and NOTIFY in the webhook
	// (workerListen; default false). Through RDS Proxy a LISTEN works but
	// pins its client connection to one database connection for the
	// session (AWS, "Avoiding pinning an RDS Proxy", conditions that cause
	// pinning for RDS for PostgreSQL: listening on a notification channel,
	// https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-pinning.html#rds-proxy-pinning.postgres);
	// the worker's connections are pinned anyway (prepared statements), so
	// one more pinned connection per invocation is its whole cost there.
	// Off by default because NOTIFY costs the webhook: PostgreSQL commits
	// notifying transactions one at a time (a database-wide lock while
	// committing), which cut the insert rate to about a third in pgbench
	// here, for a gain of at most WorkerPollInterval (250 ms) in latency
	// that the polling already keeps under the 1 s p50 goal.
	WorkerListen bool
	// OutboxRelay creates the outbox relay's event bus, archive,
	// permission, alarms and dashboard row, and sets the
	// worker's OUTBOX_BUS (outboxRelay; default true). false removes all of
	// it: outbox rows then stay in the table for a consumer of it.
	OutboxRelay bool
	// LatencyP99Alarm raises an alarm when the p99 of ReceiptToEffectSeconds
	// exceeds it for 3 consecutive 5-minute periods (latencyP99Alarm;
	// default 0 = no alarm). Off by default: the metric includes retries
	// (a receipt that failed once is processed after its backoff), and at
	// a few receipts per period the p99 is the slowest receipt, so a low
	// threshold would page for one retry. Set it (e.g. 10s) on a stage with
	// steady traffic; BacklogAge covers a stopped worker either way.
	LatencyP99Alarm time.Duration
	// StripeAPIVersion is the Stripe API version the handlers are written
	// for (stripeApiVersion; default the pinned stripe-go's,
	// stripeevent.DefaultAPIVersion). Set it to the version of the stage's
	// webhook endpoints (Stripe dashboard, Developers, Webhooks): the worker
	// counts receipts of any other version (UnexpectedApiVersion) and the
	// ApiVersionDrift alarm fires when one arrives.
	StripeAPIVersion string
	// UnnamedAPIReleases is what the worker does with an event of a Stripe
	// release the code has not named (unnamedApiReleases; default book:
	// book it when its fields satisfy the handlers' contracts, and count
	// it for ApiVersionDrift; hold: fail it for review). The worker's
	// STRIPE_UNNAMED_RELEASES; see handlers.Options.
	UnnamedAPIReleases string
	// Reconcile enables the reconciler's schedule (reconcile; default
	// true); ReconcileSchedule is its expression (reconcileSchedule;
	// default rate(15 minutes)); ReconcileEndpoint is the endpoint whose
	// events it stores (reconcileEndpoint; default the first endpoint).
	// See reconcile.go.
	Reconcile         bool
	ReconcileSchedule string
	ReconcileEndpoint string
	// ScrubPayloadAfterDays scrubs the payload of processed receipts this
	// many days after processing, before the purge deletes them
	// (scrubPayloadAfterDays; default 7 when retentionDays is longer, else 0
	// = off; otherwise at least 4 and less than retentionDays). It becomes
	// the purge's SCRUB_PAYLOAD_AFTER_DAYS. See security.go.
	ScrubPayloadAfterDays int
	// CloudTrailDataEvents records every Invoke of the ops and store
	// functions, with the caller's IAM identity, in a CloudTrail trail of
	// the stack's own (cloudTrailDataEvents; default true when
	// stripeMode=live). See security.go.
	CloudTrailDataEvents bool
	// EventBridgeSources maps each Stripe partner event source
	// (aws.partner/stripe.com/ed_...) to the endpoint its events belong to
	// (eventBridgeSources; default none; a JSON object or
	// "source=endpoint,..."): the stack associates each with a partner
	// event bus and deploys the ingest function (eventbridge.go).
	EventBridgeSources map[string]string
	// WriteBacks are the write-backs to Stripe the worker records and the
	// writeback function sends (writeBacks; default off, none: nothing is
	// created; e.g. customer_metadata). See writeback.go.
	WriteBacks []string
	// FunctionURL gives the webhook its public Function URL (functionUrl;
	// default true). false: a stage whose every endpoint comes through
	// EventBridge; it needs eventBridgeSources.
	FunctionURL bool
	// AssetsDir holds build/<function>/bootstrap as scripts/build.sh writes
	// them (assetsDir; default ../build, relative to infra/).
	AssetsDir string
}

// Protected reports whether the stage books real money (stripeMode=live):
// deletion protection, snapshot-on-delete, retained log groups, secrets and
// bus, longer backups and Multi-AZ by default, and cdk-nag's RDS checks
// enforced, whatever the stage is called.
func (s Settings) Protected() bool { return s.StripeMode == "live" }

// StackName is the CloudFormation stack name for the stage.
func (s Settings) StackName() string { return "StripeInbox-" + s.Stage }

// Functions are the Lambda functions the stack deploys; each needs
// AssetsDir/<name>/bootstrap.
var Functions = []string{"webhook", "worker", "purge", "migrate", "ops", "reconcile", "reconcilestore"}

// StripeModes are the values of the stripeMode setting (and of the worker's
// STRIPE_MODE).
var StripeModes = []string{"live", "test"}

var (
	stageName    = regexp.MustCompile(`^[a-z][a-z0-9-]{0,19}$`)
	instanceType = regexp.MustCompile(`^[a-z][a-z0-9-]*\.[a-z0-9]+$`)
	namespace    = regexp.MustCompile(`^[A-Za-z0-9_./#:-]{1,255}$`)
	email        = regexp.MustCompile(`^[^@\s,]+@[^@\s,]+\.[^@\s,]+$`)
	schedule     = regexp.MustCompile(`^(rate|cron)\(.+\)$`)
)

// logRetentionValues are the retention periods CloudWatch Logs accepts.
var logRetentionValues = []int{1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}

// SettingsFromContext reads the settings from CDK context (lookup is
// app.Node().TryGetContext, or a map in tests), applying defaults and
// reporting every invalid value at once.
func SettingsFromContext(lookup func(key string) any) (Settings, error) {
	r := reader{lookup: lookup}
	s := Settings{}
	s.Stage = r.str("stage", "dev")
	if !stageName.MatchString(s.Stage) {
		r.addf("stage=%q: must be lower-case letters, digits and -, starting with a letter, at most 20 (e.g. dev, staging, prod)", s.Stage)
		s.Stage = "dev"
	}
	s.StripeMode = r.stripeMode(s.Stage)
	live := s.StripeMode == "live"
	s.DBInstanceType = r.str("dbInstanceType", "t4g.micro")
	if !instanceType.MatchString(s.DBInstanceType) || strings.HasPrefix(s.DBInstanceType, "db.") {
		r.addf("dbInstanceType=%q: must be an instance class without the db. prefix, e.g. t4g.micro or m7g.large", s.DBInstanceType)
	}
	s.DBStorageGiB = r.integer("dbStorageGiB", 20, 20, 6000)
	s.MultiAZ = r.boolean("multiAz", live)
	s.AlarmEmail = r.str("alarmEmail", "")
	if s.AlarmEmail != "" && !email.MatchString(s.AlarmEmail) {
		r.addf("alarmEmail=%q: must be one e-mail address", s.AlarmEmail)
	}
	s.RetentionDays = r.integer("retentionDays", 30, 4, 3650)
	defaultLogs := 30
	if live {
		defaultLogs = 90
	}
	s.LogRetentionDays = r.integer("logRetentionDays", defaultLogs, 1, 3653)
	if !slices.Contains(logRetentionValues, s.LogRetentionDays) {
		r.addf("logRetentionDays=%d: must be one of CloudWatch Logs' periods %v", s.LogRetentionDays, logRetentionValues)
	}
	s.WorkerSchedule = r.str("workerSchedule", "rate(1 minute)")
	s.PurgeSchedule = r.str("purgeSchedule", "cron(15 3 * * ? *)")
	for key, v := range map[string]string{"workerSchedule": s.WorkerSchedule, "purgeSchedule": s.PurgeSchedule} {
		if !schedule.MatchString(v) {
			r.addf("%s=%q: must be an EventBridge schedule expression, rate(...) or cron(...)", key, v)
		}
	}
	s.Endpoints = r.list("endpoints", []string{"billing"})
	r.endpoints(s.Endpoints)
	s.NAT = r.boolean("nat", false)
	s.BacklogAgeAlarm = r.duration("backlogAgeAlarm", 10*time.Minute, 2*time.Minute, 24*time.Hour)
	s.WebhookReservedConcurrency = r.integer("webhookReservedConcurrency", 20, 1, 1000)
	s.DBConnectionsAlarm = r.integer("dbConnectionsAlarm", 80, 1, 100000)
	s.MetricsNamespace = r.str("metricsNamespace", "StripeInbox")
	if !namespace.MatchString(s.MetricsNamespace) || strings.HasPrefix(s.MetricsNamespace, "AWS/") {
		r.addf("metricsNamespace=%q: must be a custom CloudWatch namespace (letters, digits, . _ - / # :), not AWS/...", s.MetricsNamespace)
	}
	r.legacyAppRole(&s)
	s.WorkerPollInterval = r.fineDuration("workerPollInterval", 0, 10*time.Millisecond, time.Minute, true)
	s.WorkerWake = r.boolean("workerWake", true)
	s.WorkerTimeout = r.duration("workerTimeout", 100*time.Second, 10*time.Second, 15*time.Minute)
	s.WorkerReservedConcurrency = r.integer("workerReservedConcurrency", 3, 1, 100)
	s.WorkerListen = r.boolean("workerListen", false)
	s.OutboxRelay = r.boolean("outboxRelay", true)
	s.LatencyP99Alarm = r.fineDuration("latencyP99Alarm", 0, 100*time.Millisecond, time.Hour, true)
	r.workerTiming(s)
	s.StripeAPIVersion = r.str("stripeApiVersion", stripeevent.DefaultAPIVersion)
	if err := stripeevent.CheckAPIVersion(s.StripeAPIVersion); err != nil {
		r.addf("stripeApiVersion: %v", err)
	}
	s.UnnamedAPIReleases = r.str("unnamedApiReleases", string(handlers.BookUnnamed))
	if err := (handlers.Options{UnnamedReleases: handlers.UnnamedReleases(s.UnnamedAPIReleases)}).Validate(); err != nil {
		r.addf("unnamedApiReleases: %v", err)
	}
	r.reconcileSettings(&s)
	r.securitySettings(&s)
	r.eventBridgeSettings(&s)
	r.writeBacksSetting(&s)
	s.AssetsDir = r.str("assetsDir", filepath.Join("..", "build"))
	if len(r.problems) > 0 {
		return s, errors.New("invalid CDK context:\n  - " + strings.Join(r.problems, "\n  - "))
	}
	return s, nil
}

// CheckAssets reports the function bundles that are missing from AssetsDir.
func (s Settings) CheckAssets() error {
	var missing []string
	names := Functions
	if len(s.EventBridgeSources) > 0 {
		names = append(slices.Clip(names), "ingest")
	}
	if len(s.WriteBacks) > 0 {
		names = append(slices.Clip(names), "writeback", "writebackstore")
	}
	for _, name := range names {
		p := filepath.Join(s.AssetsDir, name, "bootstrap")
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("function bundles missing: %s (run scripts/build.sh, or set -c assetsDir=...)", strings.Join(missing, ", "))
	}
	return nil
}

// WorkerDeadlineMargin is the worker's DEADLINE_MARGIN in the stack.
const WorkerDeadlineMargin = 30 * time.Second

// WorkerMaxEventAge bounds how late a scheduled worker invocation may start
// (the function's async invoke config and the rule target's MaxEventAge): a
// throttled tick is retried by Lambda's async queue until then, so it may
// overlap invocations started up to this much later.
const WorkerMaxEventAge = time.Minute

// WorkerMinOverlap is the shortest overlap of consecutive resident
// invocations the settings accept: less than a cold start leaves a gap with
// no poller at every tick.
const WorkerMinOverlap = 5 * time.Second

// SchedulePeriod is the period of a rate(...) schedule expression, and
// false for cron(...) (or anything else).
func SchedulePeriod(expr string) (time.Duration, bool) {
	m := rateExpr.FindStringSubmatch(strings.TrimSpace(expr))
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 {
		return 0, false
	}
	unit := map[string]time.Duration{"minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}[strings.TrimSuffix(m[2], "s")]
	return time.Duration(n) * unit, true
}

var rateExpr = regexp.MustCompile(`^rate\((\d+) (minutes?|hours?|days?)\)$`)

// workerTiming checks that the worker's timeout, margin and schedule keep a
// resident poller live (timeout - margin > period) and that the reserved
// concurrency admits the invocations that overlap.
func (r *reader) workerTiming(s Settings) {
	if s.WorkerTimeout <= WorkerDeadlineMargin {
		r.addf("workerTimeout=%s must be longer than the worker's DEADLINE_MARGIN (%s)", s.WorkerTimeout, WorkerDeadlineMargin)
		return
	}
	period, ok := SchedulePeriod(s.WorkerSchedule)
	if !ok {
		return // cron(...): no fixed period to check against
	}
	if s.WorkerPollInterval > 0 && s.WorkerTimeout-WorkerDeadlineMargin < period+WorkerMinOverlap {
		r.addf("workerTimeout=%s: a resident worker polls until the timeout minus its DEADLINE_MARGIN (%s), which must be at least %s longer than the schedule's period (%s = %s) so consecutive invocations overlap by more than a cold start; set workerTimeout to at least %s, or workerPollInterval=0 for the scheduled-only worker",
			s.WorkerTimeout, WorkerDeadlineMargin, WorkerMinOverlap, s.WorkerSchedule, period, period+WorkerDeadlineMargin+WorkerMinOverlap)
	}
	// A tick may start up to WorkerMaxEventAge late (a throttled async
	// invocation is retried until then), so invocations that may be live at
	// once span timeout + max event age.
	if need := int((s.WorkerTimeout + WorkerMaxEventAge + period - 1) / period); s.WorkerReservedConcurrency < need {
		r.addf("workerReservedConcurrency=%d: invocations started every %s that may run %s, and start up to %s late, overlap up to %d at a time; reserve at least %d (or ticks are throttled)",
			s.WorkerReservedConcurrency, period, s.WorkerTimeout, WorkerMaxEventAge, need, need)
	}
}

// OutputID turns an endpoint name into the part of a CloudFormation output's
// logical ID: "connect-v2" becomes "ConnectV2".
func OutputID(endpoint string) string {
	var b strings.Builder
	upper := true
	for _, r := range endpoint {
		switch {
		case r == '-' || r == '_':
			upper = true
		case upper:
			b.WriteString(strings.ToUpper(string(r)))
			upper = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

type reader struct {
	lookup   func(string) any
	problems []string
}

func (r *reader) addf(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// raw returns the value as text (context given with -c is always a string,
// cdk.json may hold numbers and booleans) and whether it was set.
func (r *reader) raw(key string) (any, bool) {
	v := r.lookup(key)
	if v == nil {
		return nil, false
	}
	if s, ok := v.(string); ok && strings.TrimSpace(s) == "" {
		return nil, false
	}
	return v, true
}

func (r *reader) str(key, def string) string {
	v, ok := r.raw(key)
	if !ok {
		return def
	}
	s, isString := v.(string)
	if !isString {
		r.addf("%s=%v: must be a string", key, v)
		return def
	}
	return strings.TrimSpace(s)
}

func (r *reader) integer(key string, def, minimum, maximum int) int {
	v, ok := r.raw(key)
	if !ok {
		return def
	}
	var n int
	var err error
	switch t := v.(type) {
	case float64:
		n = int(t)
		if float64(n) != t {
			err = errors.New("not whole")
		}
	case string:
		n, err = strconv.Atoi(strings.TrimSpace(t))
	default:
		err = errors.New("not a number")
	}
	if err != nil || n < minimum || n > maximum {
		r.addf("%s=%v: must be a whole number from %d to %d (default %d)", key, v, minimum, maximum, def)
		return def
	}
	return n
}

func (r *reader) boolean(key string, def bool) bool {
	v, ok := r.raw(key)
	if !ok {
		return def
	}
	switch t := v.(type) {
	case bool:
		return t
	case string:
		if b, err := strconv.ParseBool(strings.TrimSpace(t)); err == nil {
			return b
		}
	}
	r.addf("%s=%v: must be true or false (default %t)", key, v, def)
	return def
}

func (r *reader) duration(key string, def, minimum, maximum time.Duration) time.Duration {
	v, ok := r.raw(key)
	if !ok {
		return def
	}
	s, _ := v.(string)
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d < minimum || d > maximum || d%time.Second != 0 {
		r.addf("%s=%v: must be a duration in whole seconds such as 10m, from %s to %s (default %s)", key, v, minimum, maximum, def)
		return def
	}
	return d
}

// fineDuration is duration with sub-second values (250ms) allowed, and 0
// when zero is true (a switch that is off).
func (r *reader) fineDuration(key string, def, minimum, maximum time.Duration, zero bool) time.Duration {
	v, ok := r.raw(key)
	if !ok {
		return def
	}
	raw := strings.TrimSpace(fmt.Sprint(v))
	d, err := time.ParseDuration(raw)
	if raw == "0" {
		d, err = 0, nil
	}
	if err != nil || (d == 0 && !zero) || (d != 0 && (d < minimum || d > maximum)) {
		off := ""
		if zero {
			off = "0 (off) or "
		}
		r.addf("%s=%v: must be %sa duration such as 250ms or 10s, from %s to %s (default %s)", key, v, off, minimum, maximum, def)
		return def
	}
	return d
}

// list accepts a JSON array (cdk.json), a JSON array in a string, or a
// comma-separated string (-c endpoints=billing,connect).
func (r *reader) list(key string, def []string) []string {
	v, ok := r.raw(key)
	if !ok {
		return def
	}
	var out []string
	switch t := v.(type) {
	case []any:
		for _, item := range t {
			s, isString := item.(string)
			if !isString {
				r.addf("%s: %v is not a string", key, item)
				return def
			}
			out = append(out, strings.TrimSpace(s))
		}
	case string:
		t = strings.TrimSpace(t)
		if strings.HasPrefix(t, "[") {
			if err := json.Unmarshal([]byte(t), &out); err != nil {
				r.addf("%s=%s: not a JSON array of strings", key, t)
				return def
			}
		} else {
			for _, item := range strings.Split(t, ",") {
				out = append(out, strings.TrimSpace(item))
			}
		}
	default:
		r.addf("%s=%v: must be a list of names", key, v)
		return def
	}
	return out
}

func (r *reader) endpoints(names []string) {
	if len(names) == 0 {
		r.addf("endpoints: at least one endpoint is needed (default billing)")
	}
	seen := map[string]string{}
	for _, name := range names {
		if !config.EndpointName.MatchString(name) {
			r.addf("endpoints: %q must be lower-case letters, digits, - and _ (it is the URL path)", name)
			continue
		}
		id := OutputID(name)
		if prev, dup := seen[id]; dup {
			r.addf("endpoints: %q and %q are the same name (or differ only in - and _)", prev, name)
		}
		seen[id] = name
	}
}
