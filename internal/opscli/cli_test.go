package opscli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/opscli"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := opscli.Main(context.Background(), args, opscli.IO{
		Env: func(k string) string { return env[k] }, Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut,
	})
	return result{code, out.String(), errOut.String()}
}

func setup(t *testing.T) (opstest.TestBundle, map[string]string) {
	t.Helper()
	fx := opstest.Seed(t, pgtest.DB(t))
	return fx, map[string]string{"DATABASE_URL": fx.DB.URL, "MAX_ATTEMPTS": "10", "STRIPE_API_VERSION": stripetest.APIVersion, "USER": "bob"}
}

func decode(t *testing.T, r result) ops.Response {
	t.Helper()
	require.Equal(t, opscli.ExitOK, r.code, r.stderr)
	var resp ops.Response
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &resp), r.stdout)
	return resp
}

// Every command against a database with receipts in every state, effects
// and an anomaly: tables for people, --json (anywhere) for scripts.
func TestEveryCommandLocally(t *testing.T) {
	t.Parallel()
	fx, env := setup(t)

	r := run(t, env, "", "status")
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{"backlog             3", "needs review        1", "open anomalies      1",
		"invoice.paid", "connect   " + opstest.OtherAPIVersion + "  <- not " + stripetest.APIVersion} {
		require.Contains(t, r.stdout, want)
	}
	st := decode(t, run(t, env, "", "--json", "status")).Status
	require.Equal(t, 3, st.Backlog)

	r = run(t, env, "", "receipts", "--state", "needs-review")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, opstest.NeedsReview)
	require.Contains(t, r.stdout, "bad_payload: no charge id")
	require.Contains(t, r.stdout, "1 receipts")
	page := decode(t, run(t, env, "", "receipts", "--state=failed", "--json", "--endpoint", "connect")).Receipts
	require.Equal(t, 1, page.Count)
	require.Equal(t, opstest.Failed2, page.Receipts[0].EventID)
	page = decode(t, run(t, env, "", "receipts", "--limit", "3", "--json", "--since", "1h")).Receipts
	require.Equal(t, 3, page.Count)
	require.NotEmpty(t, page.Next)
	next := decode(t, run(t, env, "", "receipts", "--limit", "3", "--json", "--after", page.Next)).Receipts
	require.NotEqual(t, page.Receipts[0].EventID, next.Receipts[0].EventID)

	r = run(t, env, "", "show", opstest.Paid, "--payload")
	require.Equal(t, 2, r.code, "the payload is read with a reason")
	require.Contains(t, r.stderr, "--reason is required: say why you read the customer's data")
	r = run(t, env, "", "show", opstest.Paid, "--payload", "--reason", "ticket 7")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "payload read recorded as audit row")
	require.Equal(t, 1, fx.DB.Count(t, "ops_audit", "action = 'show-payload' AND affected = 2 AND actor = 'bob' AND claimed_actor = 'bob' AND principal_arn IS NULL AND reason = 'ticket 7'"))
	for _, want := range []string{"evt_fx_paid on billing", "evt_fx_paid on connect", "payment 2500 usd under in_fx_1",
		"InvoicePaymentBooked", "invoice in_fx_1", stripeevent.Fingerprint(opstest.SecretNew), `"type": "invoice.paid"`} {
		require.Contains(t, r.stdout, want)
	}
	shown := decode(t, run(t, env, "", "show", "--json", opstest.PaidOnVoid)).Show
	require.Equal(t, fx.AnomalyID, shown.Effects.Anomalies[0].ID)

	// retry: a dry run, then the change, each with its figures.
	before := opstest.Snapshot(t, fx.DB)
	// The second failed receipt waits out its backoff, which looks like a
	// worker's lease: it is skipped, and named with its end.
	dry := decode(t, run(t, env, "", "retry", "--state", "failed", "--dry-run", "--reason", "deadlock fixed", "--json")).Retry
	require.Equal(t, 1, dry.Count)
	require.Equal(t, 1, dry.SkippedCount)
	require.Equal(t, opstest.Failed2, dry.Skipped[0].EventID)
	require.Equal(t, before, opstest.Snapshot(t, fx.DB))
	r = run(t, env, "", "retry", "--state", "failed", "--reason", "deadlock fixed")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "retried 1 receipts")
	require.Contains(t, r.stdout, opstest.Failed1)
	require.Contains(t, r.stdout, "skipped 1 receipts a worker holds right now")
	require.Regexp(t, `connect\s+`+opstest.Failed2+`\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ`, r.stdout)
	require.Contains(t, r.stdout, "audit row")
	require.Equal(t, 1, fx.DB.Count(t, "webhook_inbox", "attempts = 0 AND last_error IS NOT NULL"))
	require.Equal(t, 1, fx.DB.Count(t, "ops_audit", "action = 'retry' AND affected = 1 AND actor = 'bob' AND reason = 'deadlock fixed'"))
	one := decode(t, run(t, env, "", "retry", opstest.NeedsReview, "--reason", "fixed", "--json")).Retry
	require.Equal(t, []ops.ReceiptKey{{Endpoint: "billing", EventID: opstest.NeedsReview}}, one.Receipts)

	r = run(t, env, "", "anomalies")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "payment_on_void_invoice")
	r = run(t, env, "", "resolve", "--note", "refunded, ticket 9", strconvI(fx.AnomalyID))
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "resolved anomaly")
	require.Contains(t, run(t, env, "", "anomalies").stdout, "no open anomalies")

	r = run(t, env, "", "secrets", "--window", "2h")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, stripeevent.Fingerprint(opstest.SecretOld))
	r = run(t, env, opstest.SecretOld+"\n", "fingerprint")
	require.Equal(t, stripeevent.Fingerprint(opstest.SecretOld)+"\n", r.stdout)
	require.NotContains(t, r.stdout+r.stderr, opstest.SecretOld)
}

func strconvI(n int64) string { return strconv.FormatInt(n, 10) }

// Operator mistakes: exit 2, a message that says what to do, nothing
// changed; with --json the error is JSON on stdout too.
// show says when the reconciler listed a receipt before the endpoint's
// delivery replaced its copy.
func TestShowSaysTheReconcilerListedItFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	payload := stripetest.Event("evt_listed", "invoice.paid", stripetest.Invoice("in_listed", "cus_1", "paid", 100))
	listed, err := stripeevent.Parse(payload)
	require.NoError(t, err)
	_, err = inbox.StoreFrom(ctx, db.Pool, inbox.SourceReconcile, "billing", listed)
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": db.URL, "MAX_ATTEMPTS": "10", "USER": "bob"}
	r := run(t, env, "", "show", "evt_listed")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `source\s+reconcile\n`, r.stdout)

	delivered, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
	require.NoError(t, err)
	out, err := inbox.Store(ctx, db.Pool, "billing", delivered)
	require.NoError(t, err)
	require.Equal(t, inbox.Replaced, out)
	r = run(t, env, "", "show", "evt_listed")
	require.Contains(t, r.stdout, "webhook (the reconciler listed it first; the delivery replaced its copy)")
	shown := decode(t, run(t, env, "", "show", "--json", "evt_listed")).Show
	require.True(t, shown.Receipts[0].ListedFirst)
}

func TestMistakesExitTwoAndChangeNothing(t *testing.T) {
	t.Parallel()
	fx, env := setup(t)
	before := opstest.Snapshot(t, fx.DB)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"show", "evt_unknown"}, "no receipt of event evt_unknown"},
		{[]string{"retry", "evt_unknown", "--reason", "x"}, "no receipt of event evt_unknown"},
		{[]string{"retry", opstest.Paid, "--reason", "x"}, "is processed"},
		{[]string{"retry", "--state", "failed"}, "--reason is required"},
		{[]string{"retry", "--reason", "all of it"}, "needs an EVENT_ID or a filter"},
		{[]string{"receipts", "--since", "yesterday"}, `--since "yesterday": use an RFC 3339 time`},
		{[]string{"receipts", "--state", "stuck"}, "use one of backlog, failed, needs-review, processed"},
		{[]string{"receipts", "--limit", "0"}, "--limit \"0\": a number from 1 to 1000"},
		{[]string{"receipts", "--after", "garbage"}, "is not a page cursor"},
		{[]string{"receipts", "--reason", "x"}, "unknown flag --reason for receipts"},
		{[]string{"receipts", "evt_1"}, "receipts takes no argument"},
		{[]string{"receipts", "--endpoint"}, "--endpoint needs a value"},
		{[]string{"show"}, "show takes one EVENT_ID"},
		{[]string{"resolve", "abc", "--note", "x"}, "the anomaly's ID is a positive number"},
		{[]string{"resolve", "424242", "--note", "x"}, "no anomaly 424242"},
		{[]string{"resolve", strconvI(fx.AnomalyID)}, "--note is required"},
		{[]string{"secrets", "--window", "forever"}, "--window \"forever\""},
		{[]string{"purge"}, "unknown command \"purge\""},
		{[]string{}, "no command"},
		{[]string{"status", "--stage", "Prod!"}, "a stage name is lower-case letters"},
	} {
		r := run(t, env, "", c.args...)
		require.Equal(t, opscli.ExitMistake, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.says, c.args)
		require.Empty(t, r.stdout, c.args)
		rj := run(t, env, "", append(c.args, "--json")...)
		require.Equal(t, opscli.ExitMistake, rj.code, c.args)
		var e struct{ Error ops.Error }
		require.NoError(t, json.Unmarshal([]byte(rj.stdout), &e), rj.stdout)
		require.Contains(t, e.Error.Message, c.says)
	}
	require.Equal(t, before, opstest.Snapshot(t, fx.DB), "nothing changed")

	r := run(t, map[string]string{}, "", "status")
	require.Equal(t, opscli.ExitMistake, r.code)
	require.Contains(t, r.stderr, "DATABASE_URL is not set")
	r = run(t, map[string]string{"DATABASE_URL": fx.DB.URL, "STRIPE_API_VERSION": "latest"}, "", "status")
	require.Equal(t, opscli.ExitMistake, r.code)
	require.Contains(t, r.stderr, `STRIPE_API_VERSION: "latest" is not a Stripe API version`)
}

// A database that cannot be reached is a failure: exit 1.
func TestUnreachableDatabaseIsAFailure(t *testing.T) {
	t.Parallel()
	r := run(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}, "", "status")
	require.Equal(t, opscli.ExitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, "inboxctl: reading backlog")
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// inboxctl builds cmd/inboxctl once: the AWS SDK reads its configuration
// from the process environment, so the remote path's mistakes are tested
// on the real binary with an environment of the test's choosing.
func inboxctl(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inboxctl-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "inboxctl")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/stripe-inbox/inbox/cmd/inboxctl").CombinedOutput()
		if err != nil {
			buildErr = err
			t.Log(string(out))
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

func runBinary(t *testing.T, env []string, args ...string) result {
	t.Helper()
	bin := inboxctl(t) // built first: the build's time (long on a busy machine) is not the run's
	// A bound for a binary that hangs, not a speed: generous on any machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	home := t.TempDir()
	// Nothing from the test's environment or home: no stray credentials.
	cmd.Env = append([]string{"HOME=" + home, "PATH=/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=" + filepath.Join(home, "config"), "AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(home, "credentials")}, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{code, out.String(), errOut.String()}
}

// lambdaStandIn answers the Lambda Invoke API as AWS does for a function
// that does not exist (404, ResourceNotFoundException), and records the
// calls.
func lambdaStandIn(t *testing.T) (*httptest.Server, *[]string) {
	var mu sync.Mutex
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("X-Amzn-Errortype", "ResourceNotFoundException")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/2015-03-31/functions/"), "/invocations")
		_, _ = w.Write([]byte(`{"Type":"User","Message":"Function not found: arn:aws:lambda:eu-west-1:123456789012:function:` + name + `"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestAStageThatDoesNotExist(t *testing.T) {
	t.Parallel()
	srv, calls := lambdaStandIn(t)
	r := runBinary(t, []string{"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_ENDPOINT_URL_LAMBDA=" + srv.URL},
		"status", "--stage", "nope")
	require.Equal(t, opscli.ExitMistake, r.code, r.stderr)
	require.Contains(t, r.stderr, `stage "nope" has no ops function StripeInbox-nope-ops in this account and region`)
	require.Equal(t, []string{"POST /2015-03-31/functions/StripeInbox-nope-ops/invocations"}, *calls)
}

func TestMissingCredentials(t *testing.T) {
	t.Parallel()
	srv, calls := lambdaStandIn(t)
	r := runBinary(t, []string{"AWS_REGION=eu-west-1", "AWS_ENDPOINT_URL_LAMBDA=" + srv.URL}, "retry", "evt_1", "--reason", "x", "--stage", "prod")
	require.Equal(t, opscli.ExitMistake, r.code, r.stderr)
	require.Contains(t, r.stderr, "no AWS credentials: sign in")
	require.Contains(t, r.stderr, "lambda:InvokeFunction on StripeInbox-prod-ops")
	require.Empty(t, *calls, "nothing was sent")

	r = runBinary(t, []string{"AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=secret"}, "status", "--stage", "prod")
	require.Equal(t, opscli.ExitMistake, r.code, r.stderr)
	require.Contains(t, r.stderr, "no AWS region")
}

// TestRemoteAnswersOfTheInvokeAPI: a stand-in of the Lambda Invoke API as
// AWS answers it, reached by the real SDK: throttling (429) is retried by
// the SDK and the answer rendered; a caller without lambda:InvokeFunction
// gets exit 2 naming the permission; a failed invocation (X-Amz-Function-
// Error) is exit 1 with the function's message.
func TestRemoteAnswersOfTheInvokeAPI(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	mode, calls := "", 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		w.Header().Set("Content-Type", "application/json")
		switch {
		case mode == "throttle" && calls <= 2:
			w.Header().Set("X-Amzn-Errortype", "TooManyRequestsException")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"Reason":"ReservedFunctionConcurrentInvocationLimitExceeded","Type":"User","message":"Rate Exceeded."}`))
		case mode == "throttle":
			_, _ = w.Write([]byte(`{"command":"anomalies","anomalies":{"anomalies":[],"count":0}}`))
		case mode == "denied":
			w.Header().Set("X-Amzn-Errortype", "AccessDeniedException")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"Message":"User: arn:aws:iam::123456789012:user/dave is not authorized to perform: lambda:InvokeFunction on resource: arn:aws:lambda:eu-west-1:123456789012:function:StripeInbox-prod-ops"}`))
		case mode == "failed":
			w.Header().Set("X-Amz-Function-Error", "Unhandled")
			_, _ = w.Write([]byte(`{"errorMessage":"reading backlog: connection refused","errorType":"wrapError"}`))
		}
	}))
	t.Cleanup(srv.Close)
	env := []string{"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_ENDPOINT_URL_LAMBDA=" + srv.URL}
	set := func(m string) {
		mu.Lock()
		defer mu.Unlock()
		mode, calls = m, 0
	}

	set("throttle")
	r := runBinary(t, env, "anomalies", "--stage", "prod")
	require.Equal(t, opscli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "no open anomalies")
	mu.Lock()
	require.Equal(t, 3, calls, "two throttled, retried by the SDK")
	mu.Unlock()

	set("denied")
	r = runBinary(t, env, "anomalies", "--stage", "prod")
	require.Equal(t, opscli.ExitMistake, r.code, r.stderr)
	require.Contains(t, r.stderr, "your credentials need lambda:InvokeFunction on StripeInbox-prod-ops")

	set("failed")
	r = runBinary(t, env, "status", "--stage", "prod")
	require.Equal(t, opscli.ExitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, "StripeInbox-prod-ops failed (Unhandled): reading backlog: connection refused")
}
