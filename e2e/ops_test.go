//go:build linux

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe-inbox/inbox/internal/invokeproof/ststest"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/ops/opstest"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

var (
	inboxctlOnce sync.Once
	inboxctlPath string
	inboxctlErr  error
)

// buildInboxctl builds cmd/inboxctl once, as an operator installs it.
func buildInboxctl(t *testing.T) string {
	t.Helper()
	h := setup(t)
	inboxctlOnce.Do(func() {
		inboxctlPath = filepath.Join(workDir, "inboxctl", "inboxctl")
		cmd := exec.Command("go", "build", "-trimpath", "-o", inboxctlPath, "./cmd/inboxctl")
		cmd.Dir = h.root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			inboxctlErr = err
			t.Logf("go build ./cmd/inboxctl:\n%s", out)
		}
	})
	if inboxctlErr != nil {
		t.Fatal(inboxctlErr)
	}
	return inboxctlPath
}

// lambdaFront stands where the Lambda service is: the Invoke API for one
// function name, forwarded to the runtime emulator (which serves only the
// name "function"); any other name gets what AWS answers for a function
// that does not exist. It records the paths called.
type lambdaFront struct {
	*httptest.Server
	mu    sync.Mutex
	paths []string
}

func newLambdaFront(t *testing.T, function string, em interface{ invokeURL() string }) *lambdaFront {
	t.Helper()
	target, err := url.Parse(em.invokeURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(&url.URL{Scheme: target.Scheme, Host: target.Host})
		r.Out.URL.Path = target.Path
	}}
	f := &lambdaFront{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.Method == http.MethodPost && r.URL.Path == "/2015-03-31/functions/"+function+"/invocations" {
			proxy.ServeHTTP(w, r)
			return
		}
		name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/2015-03-31/functions/"), "/invocations")
		w.Header().Set("X-Amzn-Errortype", "ResourceNotFoundException")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"Type":"User","Message":"Function not found: arn:aws:lambda:us-east-1:000000000000:function:` + name + `"}`))
	}))
	t.Cleanup(f.Close)
	return f
}

type emulatorURL string

func (u emulatorURL) invokeURL() string { return string(u) }

type cliResult struct {
	code           int
	stdout, stderr string
}

// carol is the operator inboxctl runs as (its AWS credentials), as the STS
// stand-in knows her: an IAM user of the account the runtime emulator gives
// the function (its InvokedFunctionArn is in 012345678912).
var carol = ststest.Principal{
	AccessKeyID: "AKIDE2E", SecretAccessKey: "e2e-fake-secret",
	ARN: "arn:aws:iam::012345678912:user/carol", UserID: "AIDAE2ECAROL", Account: "012345678912",
}

// TestInboxctlAgainstAStage: inboxctl --stage e2e, with AWS credentials,
// invokes the ops binary under the runtime emulator through the real
// Lambda SDK (the Invoke API, reached through its endpoint setting): the
// same commands as locally, answered by the function inside "the VPC", with
// its changes (and its payload reads) audited under the IAM identity the
// function verified with STS (the stand-in) from the proof inboxctl signs,
// beside the name inboxctl claims, and the invocation's request id; a
// stage that does not exist and a mistake each exit 2 with what to do,
// changing nothing; a change without a verifiable proof is refused.
func TestInboxctlAgainstAStage(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "ops")
	bin := buildInboxctl(t)
	fx := opstest.Seed(t, pgtest.DB(t))
	sts := ststest.New(t, carol)
	em := emulate(t, "ops", map[string]string{
		"DATABASE_URL":         fx.DB.URL,
		"MAX_ATTEMPTS":         "10",
		"STRIPE_API_VERSION":   stripetest.APIVersion,
		"METRICS_NAMESPACE":    "StripeInboxE2E",
		"METRICS_DIMENSIONS":   "Stage=e2e",
		"AWS_REGION":           "us-east-1",
		"AWS_ENDPOINT_URL_STS": sts.URL,
	}, 20*time.Second)
	front := newLambdaFront(t, ops.FunctionName("e2e"), emulatorURL(em.InvokeURL))

	run := func(args ...string) cliResult { t.Helper(); return runInboxctl(t, bin, front.URL, sts.URL, args...) }
	decode := func(r cliResult) ops.Response {
		t.Helper()
		var resp ops.Response
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &resp) != nil {
			t.Fatalf("exit %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
		}
		return resp
	}

	st := decode(run("status", "--stage", "e2e", "--json")).Status
	if st.Backlog != 3 || st.NeedsReview != 1 || st.OpenAnomalies != 1 || st.LastHour.Receipts != 10 {
		t.Errorf("status through the function: %+v", st)
	}
	if st.OutboxBacklog != 3 || st.OutboxNeedsReview != 2 || st.OutboxMaxAttempts != 10 {
		t.Errorf("the outbox in status through the function: %+v", st)
	}
	waiting := decode(run("outbox", "--stage", "e2e", "--json")).Outbox
	if waiting.Count != 2 || waiting.Rows[0].ID != fx.OutboxWaiting[1] || waiting.Rows[1].ID != fx.OutboxWaiting[0] {
		t.Errorf("outbox through the function: %+v", waiting)
	}
	ob := decode(run("outbox-retry", strconv.FormatInt(fx.OutboxWaiting[0], 10), "--reason", "rule fixed", "--stage", "e2e", "--json")).OutboxRetry
	if ob.Count != 1 || len(ob.IDs) != 1 || ob.IDs[0] != fx.OutboxWaiting[0] ||
		fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'outbox-retry' AND request_id IS NOT NULL AND actor = $2 AND principal_arn = $2 AND claimed_actor = 'carol'", ob.AuditID, carol.ARN) != 1 {
		t.Errorf("outbox-retry through the function: %+v", ob)
	}
	r := run("--stage=e2e", "receipts", "--state", "needs-review")
	if r.code != 0 || !strings.Contains(r.stdout, opstest.NeedsReview) {
		t.Errorf("receipts: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	shown := decode(run("show", opstest.Paid, "--json", "--stage", "e2e")).Show
	if len(shown.Receipts) != 2 || len(shown.Effects.Ledger) != 1 || shown.Effects.Ledger[0].Amount != 2500 || shown.AuditID != 0 {
		t.Errorf("show: %+v", shown)
	}
	// The payload (customer data): audited like a change.
	shown = decode(run("show", opstest.Paid, "--payload", "--reason", "ticket 5", "--json", "--stage", "e2e")).Show
	if len(shown.Receipts) != 2 || shown.Receipts[0].Payload == nil ||
		fx.DB.Count(t, "ops_audit", "id = $1 AND action = 'show-payload' AND principal_arn = $2 AND reason = 'ticket 5' AND touched ? 'webhook_inbox'", shown.AuditID, carol.ARN) != 1 {
		t.Errorf("show --payload: audit row %d", shown.AuditID)
	}

	before := opstest.Snapshot(t, fx.DB)
	dry := decode(run("retry", "--state", "failed", "--dry-run", "--reason", "check", "--stage", "e2e", "--json")).Retry
	// Failed2 waits out its backoff, which looks like a worker's lease:
	// skipped and named (issue 23).
	if dry.Count != 1 || dry.SkippedCount != 1 || len(dry.Skipped) != 1 || dry.Skipped[0].EventID != opstest.Failed2 || opstest.Snapshot(t, fx.DB) != before {
		t.Errorf("dry run: %+v, or it changed something", dry)
	}
	res := decode(run("retry", "--state", "failed", "--endpoint", "billing", "--reason", "deadlock fixed", "--stage", "e2e", "--json")).Retry
	if res.Count != 1 || len(res.Receipts) != 1 || res.Receipts[0].EventID != opstest.Failed1 {
		t.Errorf("retry: %+v", res)
	}
	var actor, principal, principalID, claimed, requestID, touched string
	if err := fx.DB.Pool.QueryRow(context.Background(), "SELECT actor, principal_arn, principal_id, claimed_actor, request_id, touched::text FROM ops_audit WHERE id = $1 AND affected = 1 AND reason = 'deadlock fixed'",
		res.AuditID).Scan(&actor, &principal, &principalID, &claimed, &requestID, &touched); err != nil {
		t.Fatalf("the audit row of the retry: %v", err)
	}
	if actor != carol.ARN || principal != carol.ARN || principalID != carol.UserID || claimed != "carol" || requestID == "" ||
		touched != `{"webhook_inbox": [["billing", "`+opstest.Failed1+`"]]}` {
		t.Errorf("audit actor %q principal %q (%q) claimed %q request id %q touched %s: want carol's verified ARN, the claimed name, the invocation's request id and the receipt's key",
			actor, principal, principalID, claimed, requestID, touched)
	}
	waitLog(t, em, `"request_id":"`+requestID+`"`) // the change is in the function's log under that id

	// Mistakes, answered by the function: exit 2, nothing changed.
	before = opstest.Snapshot(t, fx.DB)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"show", "evt_unknown", "--stage", "e2e"}, "no receipt of event evt_unknown"},
		{[]string{"retry", "evt_unknown", "--reason", "x", "--stage", "e2e"}, "no receipt of event evt_unknown"},
		{[]string{"resolve", "999999", "--note", "x", "--stage", "e2e"}, "no anomaly 999999"},
		{[]string{"outbox-retry", "999999", "--reason", "x", "--stage", "e2e"}, "no outbox row 999999"},
		{[]string{"outbox-retry", strconv.FormatInt(fx.OutboxPublished, 10), "--reason", "x", "--stage", "e2e"}, "was published at"},
		{[]string{"status", "--stage", "nope"}, `stage "nope" has no ops function StripeInbox-nope-ops`},
	} {
		r := run(c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.says)
		}
	}
	// Credentials STS does not know (a made-up key): the function cannot
	// verify who asks, and refuses the change.
	r = runInboxctlAs(t, bin, front.URL, sts.URL, "AKIDNOBODY", "retry", opstest.NeedsReview, "--reason", "x", "--stage", "e2e")
	if r.code != 2 || !strings.Contains(r.stderr, "your IAM identity could not be verified") || !strings.Contains(r.stderr, "InvalidClientTokenId") {
		t.Errorf("unknown credentials: exit %d, stderr %q", r.code, r.stderr)
	}
	// A bare invocation (the console, aws lambda invoke) may read, not
	// change.
	bare := invoke(t, em, []byte(`{"command":"retry","event_id":"`+opstest.NeedsReview+`","reason":"x","actor":"carol"}`))
	if !strings.Contains(string(bare.Body), `"kind":"unverified"`) {
		t.Errorf("a bare retry: answered %d %s", bare.Status, bare.Body)
	}
	bare = invoke(t, em, []byte(`{"command":"show","event_id":"`+opstest.Paid+`"}`))
	if !strings.Contains(string(bare.Body), `"event_id":"`+opstest.Paid+`"`) {
		t.Errorf("a bare show: answered %d %s", bare.Status, bare.Body)
	}
	if opstest.Snapshot(t, fx.DB) != before {
		t.Error("a mistake changed something")
	}
	front.mu.Lock()
	defer front.mu.Unlock()
	if !contains(front.paths, "POST /2015-03-31/functions/StripeInbox-e2e-ops/invocations") || !contains(front.paths, "POST /2015-03-31/functions/StripeInbox-nope-ops/invocations") {
		t.Errorf("Invoke API calls: %v", front.paths)
	}
	if n := coldStarts(em); n != 1 {
		t.Errorf("%d cold starts: the function should start once and serve every call", n)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// runInboxctl runs the inboxctl binary with carol's AWS credentials, the
// Lambda endpoint set to lambdaURL and STS's to stsURL (what it signs its
// proofs for), and nothing else from the test's environment.
func runInboxctl(t *testing.T, bin, lambdaURL, stsURL string, args ...string) cliResult {
	t.Helper()
	return runInboxctlAs(t, bin, lambdaURL, stsURL, carol.AccessKeyID, args...)
}

func runInboxctlAs(t *testing.T, bin, lambdaURL, stsURL, accessKey string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	home := t.TempDir()
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "USER=carol", "AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=" + accessKey, "AWS_SECRET_ACCESS_KEY=" + carol.SecretAccessKey, "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=" + filepath.Join(home, "config"), "AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(home, "credentials"),
		"AWS_ENDPOINT_URL_LAMBDA=" + lambdaURL}
	if stsURL != "" {
		cmd.Env = append(cmd.Env, "AWS_ENDPOINT_URL_STS="+stsURL)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errOut.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestInboxctlWhenTheStagesDatabaseIsDown: the ops function cannot reach
// its database; the invocation fails (a function error, which its Errors
// alarm counts) and inboxctl exits 1 with the function's message, not 2.
func TestInboxctlWhenTheStagesDatabaseIsDown(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "ops")
	bin := buildInboxctl(t)
	em := emulate(t, "ops", map[string]string{
		"DATABASE_URL":       "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2",
		"METRICS_NAMESPACE":  "StripeInboxE2E",
		"METRICS_DIMENSIONS": "Stage=e2e",
		"AWS_REGION":         "us-east-1",
	}, 20*time.Second)
	front := newLambdaFront(t, ops.FunctionName("e2e"), emulatorURL(em.InvokeURL))
	r := runInboxctl(t, bin, front.URL, "", "status", "--stage", "e2e")
	if r.code != 1 || !strings.Contains(r.stderr, "StripeInbox-e2e-ops failed (") || !strings.Contains(r.stderr, "reading backlog") {
		t.Errorf("exit %d, stderr %q: want 1 and the function's error", r.code, r.stderr)
	}
	waitLog(t, em, "ops request failed")
}
