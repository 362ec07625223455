// Package opscli is the inboxctl command line: it parses arguments into an
// ops.Request, runs it locally (DATABASE_URL) or on a deployed stage (the
// stage's ops function, through the Lambda Invoke API with the caller's AWS
// credentials), and renders the answer as aligned tables or, with --json
// anywhere on the command line, as JSON.
//
// Exit codes: 0 success; 2 an operator mistake (a malformed argument, an
// unknown event id, a stage that does not exist, no AWS credentials), with
// a message that says what to do; 1 a failure (the database, the network,
// the function).
package opscli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitMistake = 2
)

// Usage is the help text.
const Usage = `inboxctl: operate the Stripe webhook inbox

Usage: inboxctl COMMAND [ARGS] [FLAGS]   (flags may come anywhere; --json too)

Commands:
  status                     backlog, oldest unprocessed age, needs review, open anomalies,
                             receipts and duplicates per type and receipt-to-effect latency
                             over the last hour, API versions per endpoint over the last day,
                             and the outbox: backlog, oldest unpublished age, rows waiting
  receipts [FILTERS]         receipts, newest first, a page at a time (--limit, --after)
  show EVENT_ID              the receipt(s) of an event and its effects (--endpoint);
                             --payload --reason TEXT: with the payload (customer data), audited
  retry EVENT_ID|FILTERS     retry unprocessed receipts: fresh attempts, claimable now;
                             skips (and lists) those a worker holds right now;
                             --reason TEXT (required), --dry-run shows what would change
  anomalies [--all]          open anomalies (--all: resolved ones too)
  resolve ID --note TEXT     mark an anomaly resolved
  secrets [--window 24h]     per endpoint, which signing secrets (by fingerprint) matched deliveries
  outbox [--all-unpublished] outbox rows that used up their attempts and wait for a human,
                             newest first, a page at a time (--limit, --after);
                             --all-unpublished: every unpublished row
  outbox-retry ID...|--waiting
                             give waiting outbox rows fresh attempts, due now (never a
                             published row); --reason TEXT (required), --dry-run
  writebacks                 write-backs to Stripe that wait for a human (parked), oldest first
  writeback ID               one write-back: its parameters, key, attempts, last error and result
  writeback-retry ID         send a parked write-back again (fresh attempts, due now; the
                             sender reads back first once its key is 24 h old)
                             --reason TEXT (required), --dry-run
  fingerprint                print the fingerprint of the signing secret read from stdin

Filters: --endpoint NAME --type EVENT_TYPE --state backlog|failed|needs-review|processed
         --since T --until T (RFC 3339, a date 2026-12-01, or an age: 90m, 2h, 7d) --error TEXT
Where:   locally DATABASE_URL (and MAX_ATTEMPTS, OUTBOX_MAX_ATTEMPTS, STRIPE_API_VERSION as the worker's);
         --stage NAME invokes the stage's ops function StripeInbox-NAME-ops with your AWS
         credentials (needs lambda:InvokeFunction on it), which verifies who you are with STS
         and records that identity with every change and every --payload
Output:  aligned tables; --json for scripts
Exit:    0 ok, 2 a mistake (the message says what to do), 1 a failure
`

// IO is what a run reads and writes.
type IO struct {
	Env    func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Now is the clock for relative times (--since 2h); time.Now.
	Now func() time.Time
}

// Main runs inboxctl with args (without the program name) and returns the
// exit code.
func Main(ctx context.Context, args []string, io IO) int {
	if io.Now == nil {
		io.Now = time.Now
	}
	inv, err := parse(args, io.Now())
	if err != nil {
		return fail(io, inv.json, err)
	}
	switch inv.command {
	case "help":
		fmt.Fprint(io.Stdout, Usage)
		return ExitOK
	case "fingerprint":
		return fingerprint(io, inv.json)
	}
	inv.req.Actor = actor(io.Env)
	var t transport
	if inv.stage != "" {
		t, err = newRemote(ctx, inv.stage)
	} else {
		t, err = newLocal(ctx, io.Env)
	}
	if err != nil {
		return fail(io, inv.json, err)
	}
	defer t.close()
	resp, err := t.do(ctx, inv.req)
	if err != nil {
		return fail(io, inv.json, err)
	}
	if inv.json {
		enc := json.NewEncoder(io.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(resp); err != nil {
			return fail(io, false, err)
		}
		return ExitOK
	}
	render(io.Stdout, resp, io.Now())
	return ExitOK
}

// fail reports err and returns its exit code: ExitMistake for an operator
// mistake (*ops.Error), ExitFailure otherwise. With --json the error also
// goes to stdout as {"error": {"kind", "message"}}.
func fail(io IO, asJSON bool, err error) int {
	code, kind := ExitFailure, "failure"
	var opErr *ops.Error
	if errors.As(err, &opErr) {
		code, kind = ExitMistake, opErr.Kind
	}
	fmt.Fprintf(io.Stderr, "inboxctl: %v\n", err)
	if asJSON {
		b, _ := json.Marshal(map[string]any{"error": map[string]string{"kind": kind, "message": err.Error()}})
		fmt.Fprintln(io.Stdout, string(b))
	}
	return code
}

func mistakef(format string, args ...any) error {
	return &ops.Error{Kind: ops.KindInvalid, Message: fmt.Sprintf(format, args...)}
}

func actor(env func(string) string) string {
	for _, k := range []string{"INBOXCTL_ACTOR", "USER", "LOGNAME"} {
		if v := strings.TrimSpace(env(k)); v != "" {
			return v
		}
	}
	return "unknown"
}

func fingerprint(io IO, asJSON bool) int {
	b, err := readAll(io.Stdin, 4096)
	if err != nil {
		return fail(io, asJSON, err)
	}
	var out []map[string]string
	for _, s := range strings.FieldsFunc(string(b), func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
		out = append(out, map[string]string{"fingerprint": stripeevent.Fingerprint(s)})
	}
	if len(out) == 0 {
		return fail(io, asJSON, mistakef("no secret on stdin: pipe it in, e.g. pbpaste | inboxctl fingerprint (it is never printed)"))
	}
	if asJSON {
		b, _ := json.Marshal(map[string]any{"fingerprints": out})
		fmt.Fprintln(io.Stdout, string(b))
		return ExitOK
	}
	for _, f := range out {
		fmt.Fprintln(io.Stdout, f["fingerprint"])
	}
	return ExitOK
}

func readAll(r io.Reader, max int64) ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, max))
	if err != nil {
		return nil, fmt.Errorf("reading stdin: %w", err)
	}
	return b, nil
}

// invocation is a parsed command line.
type invocation struct {
	command string
	req     ops.Request
	json    bool
	stage   string
}

// valueFlags take a value (--flag value or --flag=value); every other flag
// is a switch. The same flag means the same thing for every command.
var valueFlags = map[string]bool{
	"endpoint": true, "type": true, "state": true, "since": true, "until": true, "error": true,
	"limit": true, "after": true, "reason": true, "note": true, "window": true, "stage": true,
}

// commandFlags are the flags each command accepts besides --json and
// --stage.
var commandFlags = map[string][]string{
	ops.CmdStatus:         {},
	ops.CmdReceipts:       {"endpoint", "type", "state", "since", "until", "error", "limit", "after"},
	ops.CmdShow:           {"endpoint", "payload", "reason"},
	ops.CmdRetry:          {"endpoint", "type", "state", "since", "until", "error", "dry-run", "reason"},
	ops.CmdAnomalies:      {"all", "limit"},
	ops.CmdResolve:        {"note"},
	ops.CmdSecrets:        {"window"},
	ops.CmdOutbox:         {"all-unpublished", "limit", "after"},
	ops.CmdOutboxRetry:    {"waiting", "dry-run", "reason"},
	ops.CmdWritebacks:     {"limit"},
	ops.CmdWriteback:      {},
	ops.CmdWritebackRetry: {"dry-run", "reason"},
	"fingerprint":         {},
	"help":                {},
}

// positional is how many positional arguments each command takes (after
// the command): exactly 1 for show and resolve, at most 1 for retry.
var positional = map[string][2]int{ops.CmdShow: {1, 1}, ops.CmdResolve: {1, 1}, ops.CmdRetry: {0, 1}, ops.CmdOutboxRetry: {0, ops.MaxOutboxIDs},
	ops.CmdWriteback: {1, 1}, ops.CmdWritebackRetry: {1, 1}}

var stageName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,19}$`)

// parse reads args: the command, its positional arguments and flags in any
// order (--flag value, --flag=value, -flag), --json and --stage anywhere.
func parse(args []string, now time.Time) (invocation, error) {
	var inv invocation
	var pos []string
	vals := map[string]string{}
	for _, a := range args { // first, so that even a parse error is reported as JSON
		if a == "--json" || a == "-json" {
			inv.json = true
		}
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case name == "h" || name == "help":
			inv.command = "help"
			return inv, nil
		case valueFlags[name] && !hasValue:
			if i+1 >= len(args) || strings.HasPrefix(args[i+1], "--") {
				return inv, mistakef("--%s needs a value", name)
			}
			i++
			value = args[i]
		case valueFlags[name]:
		case hasValue:
			b, err := strconv.ParseBool(value)
			if err != nil {
				return inv, mistakef("--%s=%s: use --%s alone, or =true/=false", name, value, name)
			}
			value = strconv.FormatBool(b)
		default:
			value = "true"
		}
		if _, dup := vals[name]; dup {
			return inv, mistakef("--%s is given twice", name)
		}
		vals[name] = value
	}
	if len(pos) == 0 {
		return inv, mistakef("no command: run inboxctl help")
	}
	inv.command, pos = pos[0], pos[1:]
	allowed, ok := commandFlags[inv.command]
	if !ok {
		return inv, mistakef("unknown command %q: use status, receipts, show, retry, anomalies, resolve, secrets, outbox, outbox-retry, writebacks, writeback, writeback-retry or fingerprint (inboxctl help)", inv.command)
	}
	for name := range vals {
		if name != "json" && name != "stage" && !slices.Contains(allowed, name) {
			return inv, mistakef("unknown flag --%s for %s: run inboxctl help", name, inv.command)
		}
	}
	inv.json, inv.stage = vals["json"] == "true", vals["stage"]
	if inv.stage != "" && !stageName.MatchString(inv.stage) {
		return inv, mistakef("--stage %q: a stage name is lower-case letters, digits and -, starting with a letter (e.g. prod)", inv.stage)
	}
	if n, ok := positional[inv.command]; ok {
		if len(pos) < n[0] || len(pos) > n[1] {
			return inv, mistakef("%s takes %s: %s", inv.command, map[string]string{
				ops.CmdShow: "one EVENT_ID", ops.CmdResolve: "one anomaly ID", ops.CmdRetry: "one EVENT_ID or filters",
				ops.CmdOutboxRetry: fmt.Sprintf("at most %d outbox row IDs (or --waiting)", ops.MaxOutboxIDs),
				ops.CmdWriteback:   "one write-back ID", ops.CmdWritebackRetry: "one write-back ID",
			}[inv.command], strings.Join(append([]string{"got"}, quoted(pos)...), " "))
		}
	} else if len(pos) > 0 {
		return inv, mistakef("%s takes no argument %s: filters are flags (inboxctl help)", inv.command, strings.Join(quoted(pos), " "))
	}

	r := ops.Request{Command: inv.command}
	f := &r.Filter
	f.Endpoint, f.Type, f.State, f.Error = vals["endpoint"], vals["type"], vals["state"], vals["error"]
	r.After, r.Reason, r.Note, r.Window = vals["after"], vals["reason"], vals["note"], vals["window"]
	r.Payload, r.DryRun, r.All = vals["payload"] == "true", vals["dry-run"] == "true", vals["all"] == "true"
	r.Waiting, r.AllUnpublished = vals["waiting"] == "true", vals["all-unpublished"] == "true"
	for name, dst := range map[string]**time.Time{"since": &f.Since, "until": &f.Until} {
		if v, ok := vals[name]; ok {
			t, err := parseTime(v, now)
			if err != nil {
				return inv, mistakef("--%s %q: %v", name, v, err)
			}
			*dst = &t
		}
	}
	if v, ok := vals["limit"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ops.MaxLimit {
			return inv, mistakef("--limit %q: a number from 1 to %d", v, ops.MaxLimit)
		}
		r.Limit = n
	}
	switch inv.command {
	case ops.CmdShow, ops.CmdRetry:
		if len(pos) == 1 {
			r.EventID = pos[0]
		}
	case ops.CmdResolve:
		id, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id <= 0 {
			return inv, mistakef("resolve %q: the anomaly's ID is a positive number (inboxctl anomalies lists them)", pos[0])
		}
		r.AnomalyID = id
	case ops.CmdWriteback, ops.CmdWritebackRetry:
		id, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id <= 0 {
			return inv, mistakef("%s %q: a write-back ID is a positive number (inboxctl writebacks lists them)", inv.command, pos[0])
		}
		r.WritebackID = id
	case ops.CmdOutboxRetry:
		for _, p := range pos {
			id, err := strconv.ParseInt(p, 10, 64)
			if err != nil || id <= 0 {
				return inv, mistakef("outbox-retry %q: an outbox row ID is a positive number (inboxctl outbox lists them)", p)
			}
			r.OutboxIDs = append(r.OutboxIDs, id)
		}
	}
	inv.req = r
	return inv, nil
}

func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

var age = regexp.MustCompile(`^([0-9]+)(s|m|h|d)$`)

// parseTime reads an RFC 3339 time, a date (midnight UTC), or an age
// before now (90m, 2h, 7d).
func parseTime(s string, now time.Time) (time.Time, error) {
	if m := age.FindStringSubmatch(s); m != nil {
		n, _ := strconv.Atoi(m[1])
		unit := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[m[2]]
		return now.Add(-time.Duration(n) * unit), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("use an RFC 3339 time (2026-12-01T08:00:00Z), a date (2026-12-01) or an age (90m, 2h, 7d)")
}

// transport runs a request somewhere.
type transport interface {
	do(ctx context.Context, r ops.Request) (ops.Response, error)
	close()
}

// local runs requests against DATABASE_URL.
type local struct {
	ops *ops.Ops
}

func newLocal(ctx context.Context, env func(string) string) (transport, error) {
	if strings.TrimSpace(env("DATABASE_URL")) == "" {
		return nil, mistakef("DATABASE_URL is not set: export DATABASE_URL=postgres://user@host:5432/db, or use --stage NAME for a deployed stage")
	}
	cfg, err := config.LoadOps(env)
	if err != nil {
		return nil, &ops.Error{Kind: ops.KindInvalid, Message: err.Error()}
	}
	cfg.Database.AppName = "inboxctl"
	pool, err := database.Open(ctx, cfg.Database, nil)
	if err != nil {
		return nil, &ops.Error{Kind: ops.KindInvalid, Message: err.Error()}
	}
	o, err := ops.New(pool, cfg.Ops, nil)
	if err != nil {
		pool.Close()
		return nil, &ops.Error{Kind: ops.KindInvalid, Message: err.Error()}
	}
	return &local{ops: o}, nil
}

func (l *local) do(ctx context.Context, r ops.Request) (ops.Response, error) {
	return l.ops.Do(ctx, r, ops.Caller{Actor: r.Actor})
}

func (l *local) close() { l.ops.Pool.Close() }
