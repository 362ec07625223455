// Package ops is what an operator does to a running inbox without writing
// SQL: read the status, list and show receipts, retry receipts, list and
// resolve anomalies, see which signing secrets still match deliveries, and
// list and retry the outbox rows that used up their attempts (outbox.go).
//
// One Request in, one Response out, as JSON: cmd/inboxctl runs Do against
// DATABASE_URL locally, and against a deployed stage it invokes the stack's
// ops function (functions/ops), which runs the same Do inside the VPC.
// Requests are checked here, whoever sent them, so the function refuses
// what the command would refuse.
//
// Every change (retry, resolve, outbox-retry) is one statement plus one ops_audit row
// (what, the selection, how many rows and their keys, the reason, who: the
// IAM identity STS verified and the name the caller claimed, the Lambda
// request id) in the same transaction, and is logged. Reading a payload
// (show --payload: customer data) is audited the same way. A dry run
// changes nothing and writes no audit row. The ops function runs an audited
// request only for a caller whose identity it verified (function.go).
//
// Operator mistakes (a malformed filter, an unknown event id, a missing
// reason) are *Error values with a Kind and a message that says what to
// do; everything else is a failure (the database, the network).
//
// ops.go is the request, its checks and Do; one file per command group:
// status.go (status), receipts.go (receipts, show, retry), anomalies.go
// (anomalies, resolve), secrets.go (secrets), outbox.go (outbox,
// outbox-retry); audit.go writes the audit row and the change's log line.
package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/invokeproof"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// Commands.
const (
	CmdStatus    = "status"
	CmdReceipts  = "receipts"
	CmdShow      = "show"
	CmdRetry     = "retry"
	CmdAnomalies = "anomalies"
	CmdResolve   = "resolve"
	CmdSecrets   = "secrets"
	// CmdOutbox lists the outbox rows that used up their attempts and
	// wait for a human (with AllUnpublished, every unpublished row);
	// CmdOutboxRetry gives them fresh attempts (outbox.go).
	CmdOutbox      = "outbox"
	CmdOutboxRetry = "outbox-retry"
	// CmdWritebacks lists the write-backs to Stripe waiting for a human,
	// CmdWriteback shows one (attempts, result), CmdWritebackRetry sends a
	// parked one again (writebacks.go).
	CmdWritebacks     = "writebacks"
	CmdWriteback      = "writeback"
	CmdWritebackRetry = "writeback-retry"
)

// Commands lists every command Do accepts.
var Commands = []string{CmdStatus, CmdReceipts, CmdShow, CmdRetry, CmdAnomalies, CmdResolve, CmdSecrets, CmdOutbox, CmdOutboxRetry,
	CmdWritebacks, CmdWriteback, CmdWritebackRetry}

// Limits of a request.
const (
	DefaultLimit     = 50   // receipts per page
	DefaultAnomalies = 100  // anomalies listed with All
	MaxLimit         = 1000 // either
	// MaxListedKeys bounds the receipts a retry lists (the count is exact).
	MaxListedKeys = 1000
	// DefaultWindow is the secrets command's window: Stripe keeps an old
	// secret valid for up to 24 hours after a roll.
	DefaultWindow = 24 * time.Hour
	MinWindow     = time.Minute
	MaxWindow     = 90 * 24 * time.Hour
	// MaxReasonLength bounds --reason and --note.
	MaxReasonLength = 1000
)

// Filter selects receipts (receipts, retry). Empty fields match everything.
type Filter struct {
	Endpoint string     `json:"endpoint,omitempty"`
	Type     string     `json:"type,omitempty"`
	State    string     `json:"state,omitempty"` // inbox.States
	Error    string     `json:"error,omitempty"` // a case-insensitive substring of last_error
	Since    *time.Time `json:"since,omitempty"`
	Until    *time.Time `json:"until,omitempty"` // exclusive
}

func (f Filter) empty() bool {
	return f.Endpoint == "" && f.Type == "" && f.State == "" && f.Error == "" && f.Since == nil && f.Until == nil
}

// Request is one operator command.
type Request struct {
	Command string `json:"command"`
	// EventID: show and retry of one event (on every endpoint that received
	// it, or Filter.Endpoint's).
	EventID string `json:"event_id,omitempty"`
	Filter  Filter `json:"filter"`
	// Limit and After page receipts (After is the previous page's Next)
	// and bound anomalies with All.
	Limit int    `json:"limit,omitempty"`
	After string `json:"after,omitempty"`
	// Payload: show returns the payload too.
	Payload bool `json:"payload,omitempty"`
	// DryRun: retry returns what it would change and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Reason: why retry (required).
	Reason string `json:"reason,omitempty"`
	// AnomalyID and Note: resolve (the note is required).
	AnomalyID int64  `json:"anomaly_id,omitempty"`
	Note      string `json:"note,omitempty"`
	// All: anomalies lists resolved ones too.
	All bool `json:"all,omitempty"`
	// Window: secrets counts deliveries over it (a duration such as 24h or
	// 7d; default 24h).
	Window string `json:"window,omitempty"`
	// OutboxIDs: outbox-retry of these outbox rows; Waiting: of every row
	// waiting for a human (one of the two).
	OutboxIDs []int64 `json:"outbox_ids,omitempty"`
	// WritebackID: writeback and writeback-retry of this intent.
	WritebackID int64 `json:"writeback_id,omitempty"`
	Waiting     bool  `json:"waiting,omitempty"`
	// AllUnpublished: outbox lists every unpublished row, not only those
	// waiting for a human.
	AllUnpublished bool `json:"all_unpublished,omitempty"`
	// Actor names who asked, as the caller says (the command sends the
	// local user name). It is recorded as the claimed name beside the
	// verified IAM identity (Caller.Principal), never instead of it.
	Actor string `json:"actor,omitempty"`
}

// Audited reports whether r writes an ops_audit row: a change (retry,
// resolve, outbox-retry; not their dry runs) or a read of customer data
// (show --payload). The ops function runs these only for a caller whose
// IAM identity it verified (Function).
func (r Request) Audited() bool {
	switch r.Command {
	case CmdRetry, CmdOutboxRetry, CmdWritebackRetry:
		return !r.DryRun
	case CmdResolve:
		return true
	case CmdShow:
		return r.Payload
	}
	return false
}

// Kinds of operator mistakes.
const (
	KindInvalid  = "invalid"   // the request is malformed or incomplete
	KindNotFound = "not_found" // it names something that does not exist
	KindConflict = "conflict"  // the target is not in a state the command applies to
)

// Error is an operator mistake: nothing was changed, and Message says what
// to do.
type Error struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

func invalidf(format string, args ...any) *Error {
	return &Error{Kind: KindInvalid, Message: fmt.Sprintf(format, args...)}
}

// Response is one command's answer; exactly one of the command's fields is
// set (Error when the request was an operator mistake; only the ops
// function's handler sets it, Do returns the error).
type Response struct {
	Command   string         `json:"command"`
	Status    *Status        `json:"status,omitempty"`
	Receipts  *ReceiptPage   `json:"receipts,omitempty"`
	Show      *Shown         `json:"show,omitempty"`
	Retry     *RetryResult   `json:"retry,omitempty"`
	Anomalies *AnomalyList   `json:"anomalies,omitempty"`
	Resolved  *Resolved      `json:"resolved,omitempty"`
	Secrets   *SecretsReport `json:"secrets,omitempty"`
	// Outbox and OutboxRetry answer CmdOutbox and CmdOutboxRetry.
	Outbox      *OutboxPage        `json:"outbox,omitempty"`
	OutboxRetry *OutboxRetryResult `json:"outbox_retry,omitempty"`
	// Writebacks, Writeback and WritebackRetry answer CmdWritebacks,
	// CmdWriteback and CmdWritebackRetry.
	Writebacks     *WritebackList        `json:"writebacks,omitempty"`
	Writeback      *writeback.Detail     `json:"writeback,omitempty"`
	WritebackRetry *WritebackRetryResult `json:"writeback_retry,omitempty"`
	Error          *Error                `json:"error,omitempty"`
}

// Caller is who runs a request, for the audit trail.
type Caller struct {
	// Principal is the caller's IAM identity as STS verified it (the ops
	// function, from the proof inboxctl sends; see Function); nil for a
	// local run, whose identity is whoever holds DATABASE_URL.
	Principal *invokeproof.Identity
	// Actor is the name the caller gave (the local user name inboxctl
	// sends): recorded as claimed_actor, and as actor only when there is
	// no verified identity.
	Actor     string
	RequestID string // the Lambda request id; empty locally
}

// Config is what Ops needs to know of the stage.
type Config struct {
	// MaxAttempts is the worker's MAX_ATTEMPTS: receipts at it wait for
	// review.
	MaxAttempts int
	// OutboxMaxAttempts is the relay's OUTBOX_MAX_ATTEMPTS: outbox rows at
	// it wait for a human (0: outbox.DefaultMaxAttempts).
	OutboxMaxAttempts int
	// APIVersion is the Stripe API version the stage's handlers are
	// written for (STRIPE_API_VERSION); status marks other versions. May be
	// empty.
	APIVersion string
}

// Validate reports every mistake, naming the variable.
func (c Config) Validate() error {
	errs := []error{inbox.CheckMaxAttempts(c.MaxAttempts)}
	if c.OutboxMaxAttempts != 0 {
		errs = append(errs, outbox.CheckMaxAttempts(c.OutboxMaxAttempts))
	}
	if c.APIVersion != "" {
		if err := stripeevent.CheckAPIVersion(c.APIVersion); err != nil {
			errs = append(errs, fmt.Errorf("STRIPE_API_VERSION: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Ops runs requests against one database.
type Ops struct {
	Pool *pgxpool.Pool
	Config
	Logger *slog.Logger
	// Now is the clock of the status and secrets windows (time.Now).
	Now func() time.Time
}

// New returns an Ops, refusing an invalid cfg or a missing pool. logger may
// be nil (inboxctl's local runs do not log).
func New(pool *pgxpool.Pool, cfg Config, logger *slog.Logger) (*Ops, error) {
	errs := []error{cfg.Validate()}
	if pool == nil {
		errs = append(errs, errors.New("no database pool"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("ops: %w", err)
	}
	if cfg.OutboxMaxAttempts == 0 {
		cfg.OutboxMaxAttempts = outbox.DefaultMaxAttempts
	}
	return &Ops{Pool: pool, Config: cfg, Logger: logger, Now: time.Now}, nil
}

// Handle is Do for the ops function: an operator mistake is answered in
// Response.Error (the invocation succeeds; the Errors alarm is for
// failures), a failure is returned.
func (o *Ops) Handle(ctx context.Context, req Request, c Caller) (Response, error) {
	resp, err := o.Do(ctx, req, c)
	var opErr *Error
	if errors.As(err, &opErr) {
		return Response{Command: req.Command, Error: opErr}, nil
	}
	return resp, err
}

// Do runs req. An operator mistake is returned as *Error, and nothing is
// changed then.
func (o *Ops) Do(ctx context.Context, req Request, c Caller) (Response, error) {
	if err := req.check(); err != nil {
		return Response{}, err
	}
	resp := Response{Command: req.Command}
	var err error
	switch req.Command {
	case CmdStatus:
		resp.Status, err = o.status(ctx)
	case CmdReceipts:
		resp.Receipts, err = o.receipts(ctx, req)
	case CmdShow:
		resp.Show, err = o.show(ctx, req, c)
	case CmdRetry:
		resp.Retry, err = o.retry(ctx, req, c)
	case CmdAnomalies:
		resp.Anomalies, err = o.anomalies(ctx, req)
	case CmdResolve:
		resp.Resolved, err = o.resolve(ctx, req, c)
	case CmdSecrets:
		resp.Secrets, err = o.secrets(ctx, req)
	case CmdOutbox:
		resp.Outbox, err = o.outboxRows(ctx, req)
	case CmdOutboxRetry:
		resp.OutboxRetry, err = o.outboxRetry(ctx, req, c)
	case CmdWritebacks:
		resp.Writebacks, err = o.writebacks(ctx, req)
	case CmdWriteback:
		resp.Writeback, err = o.writeback(ctx, req)
	case CmdWritebackRetry:
		resp.WritebackRetry, err = o.writebackRetry(ctx, req, c)
	}
	if err != nil {
		return Response{}, err
	}
	return resp, nil
}

// check refuses what no command accepts, with what to do instead.
func (r Request) check() error {
	if !slices.Contains(Commands, r.Command) {
		return invalidf("unknown command %q: use one of %s", r.Command, strings.Join(Commands, ", "))
	}
	f := r.Filter
	if f.State != "" && !slices.Contains(inbox.States, f.State) {
		return invalidf("--state %q: use one of %s", f.State, strings.Join(inbox.States, ", "))
	}
	if f.Since != nil && f.Until != nil && !f.Since.Before(*f.Until) {
		return invalidf("--since %s is not before --until %s: give a window that is not empty", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	if r.Limit < 0 || r.Limit > MaxLimit {
		return invalidf("--limit %d: use 1 to %d", r.Limit, MaxLimit)
	}
	switch r.Command {
	case CmdShow:
		if r.EventID == "" {
			return invalidf("show needs an EVENT_ID (evt_...): inboxctl show evt_123")
		}
		if r.Payload {
			// The payload is customer data: its read is audited like a
			// change, with a reason.
			if err := checkText("--reason", r.Reason, "say why you read the customer's data, e.g. --payload --reason 'ticket 123: amount disputed'"); err != nil {
				return err
			}
		}
	case CmdRetry:
		if r.EventID == "" && f.empty() {
			return invalidf("retry needs an EVENT_ID or a filter (--endpoint, --type, --state, --since, --until, --error), e.g. --state needs-review; try it with --dry-run first")
		}
		if f.State == inbox.StateProcessed {
			return invalidf("--state processed: processed receipts are never retried (their effect has committed); retry backlog, failed or needs-review receipts")
		}
		if err := checkText("--reason", r.Reason, "say why, e.g. --reason 'fixed the handler, ticket 123'"); err != nil {
			return err
		}
	case CmdResolve:
		if r.AnomalyID <= 0 {
			return invalidf("resolve needs the anomaly's ID (a positive number from inboxctl anomalies): inboxctl resolve 12 --note '...'")
		}
		if err := checkText("--note", r.Note, "say what was done, e.g. --note 'refunded in the dashboard, ticket 123'"); err != nil {
			return err
		}
	case CmdSecrets:
		if _, err := window(r.Window); err != nil {
			return err
		}
	case CmdOutbox:
		if r.After != "" {
			if _, err := decodeOutboxCursor(r.After); err != nil {
				return err
			}
		}
		return nil
	case CmdOutboxRetry:
		return r.checkOutboxRetry()
	case CmdWritebacks:
		return nil
	case CmdWriteback, CmdWritebackRetry:
		return r.checkWriteback()
	}
	if r.After != "" {
		if _, err := decodeCursor(r.After); err != nil {
			return err
		}
	}
	return nil
}

func checkText(flag, v, hint string) error {
	v = strings.TrimSpace(v)
	switch {
	case v == "":
		return invalidf("%s is required: %s", flag, hint)
	case len(v) > MaxReasonLength:
		return invalidf("%s is %d characters: keep it to %d", flag, len(v), MaxReasonLength)
	}
	return nil
}

// FunctionName is the name the stack gives a stage's ops function
// (infra/stack); inboxctl --stage invokes it.
func FunctionName(stage string) string { return "StripeInbox-" + stage + "-ops" }
