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
// (what, the selection, how many rows, the reason, who, the Lambda request
// id) in the same transaction, and is logged. A dry run changes nothing
// and writes no audit row.
//
// Operator mistakes (a malformed filter, an unknown event id, a missing
// reason) are *Error values with a Kind and a message that says what to
// do; everything else is a failure (the database, the network).
package ops

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/worker"
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
)

// Commands lists every command Do accepts.
var Commands = []string{CmdStatus, CmdReceipts, CmdShow, CmdRetry, CmdAnomalies, CmdResolve, CmdSecrets, CmdOutbox, CmdOutboxRetry}

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
	Waiting   bool    `json:"waiting,omitempty"`
	// AllUnpublished: outbox lists every unpublished row, not only those
	// waiting for a human.
	AllUnpublished bool `json:"all_unpublished,omitempty"`
	// Actor names who asked (the command sends the local user name). The
	// ops function records it next to the Lambda request id, which
	// CloudTrail ties to the verified IAM principal.
	Actor string `json:"actor,omitempty"`
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
	Error       *Error             `json:"error,omitempty"`
}

// Caller is who runs a request, for the audit trail.
type Caller struct {
	Actor     string // the local user, or what the command sent
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
	errs := []error{worker.CheckMaxAttempts(c.MaxAttempts)}
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
		resp.Show, err = o.show(ctx, req)
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

// window parses a secrets window: a Go duration (36h) or whole days (7d).
func window(s string) (time.Duration, error) {
	if s == "" {
		return DefaultWindow, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, nerr := strconv.Atoi(days)
		d, err = time.Duration(n)*24*time.Hour, nerr
	}
	if err != nil || d < MinWindow || d > MaxWindow {
		return 0, invalidf("--window %q: use a duration from %s to %s such as 24h or 7d", s, MinWindow, "90d")
	}
	return d, nil
}

func (o *Ops) filter(r Request) inbox.Filter {
	f := r.Filter
	return inbox.Filter{Endpoint: f.Endpoint, EventType: f.Type, EventID: r.EventID, State: f.State, ErrorText: f.Error,
		Since: f.Since, Until: f.Until, MaxAttempts: o.MaxAttempts}
}

// Status is the inbox at a glance.
type Status struct {
	At                          time.Time `json:"at"`
	Backlog                     int       `json:"backlog"`
	OldestUnprocessedAgeSeconds float64   `json:"oldest_unprocessed_age_seconds"`
	NeedsReview                 int       `json:"needs_review"`
	OpenAnomalies               int       `json:"open_anomalies"`
	MaxAttempts                 int       `json:"max_attempts"`
	// The outbox (outbox.ReadBacklog): unpublished rows still being
	// tried, the age of the oldest, and the rows that used up
	// OutboxMaxAttempts and wait for a human (inboxctl outbox).
	OutboxBacklog          int     `json:"outbox_backlog"`
	OutboxOldestAgeSeconds float64 `json:"outbox_oldest_age_seconds"`
	OutboxNeedsReview      int     `json:"outbox_needs_review"`
	OutboxMaxAttempts      int     `json:"outbox_max_attempts"`
	// LastHour: receipts and duplicate deliveries per type, and
	// receipt-to-effect latency, over the last hour.
	LastHour LastHour `json:"last_hour"`
	// APIVersions: receipts per endpoint and API version over the last
	// day; Expected is false for versions other than ExpectedAPIVersion.
	ExpectedAPIVersion string       `json:"expected_api_version,omitempty"`
	APIVersions        []APIVersion `json:"api_versions"`
}

// LastHour is Status's hour.
type LastHour struct {
	Receipts   int               `json:"receipts"`
	Duplicates int               `json:"duplicates"`
	Types      []inbox.TypeCount `json:"types"`
	Latency    inbox.Latency     `json:"latency"`
}

// APIVersion is one endpoint's receipts of one API version.
type APIVersion struct {
	inbox.VersionCount
	Expected bool `json:"expected"`
}

func (o *Ops) status(ctx context.Context) (*Status, error) {
	now := o.Now().UTC()
	s := &Status{At: now, MaxAttempts: o.MaxAttempts, OutboxMaxAttempts: o.OutboxMaxAttempts, ExpectedAPIVersion: o.APIVersion, APIVersions: []APIVersion{}}
	b, err := inbox.Stats(ctx, o.Pool, o.MaxAttempts, nil)
	if err != nil {
		return nil, err
	}
	s.Backlog, s.OldestUnprocessedAgeSeconds, s.NeedsReview = b.Count, b.OldestAgeSeconds, b.NeedsReview
	ob, err := outbox.ReadBacklog(ctx, o.Pool, o.OutboxMaxAttempts, nil)
	if err != nil {
		return nil, err
	}
	s.OutboxBacklog, s.OutboxOldestAgeSeconds, s.OutboxNeedsReview = ob.Count, ob.OldestAgeSeconds, ob.NeedsReview
	if s.OpenAnomalies, err = handlers.UnresolvedAnomalies(ctx, o.Pool); err != nil {
		return nil, err
	}
	hour := now.Add(-time.Hour)
	if s.LastHour.Types, err = inbox.TypesSince(ctx, o.Pool, hour); err != nil {
		return nil, err
	}
	for _, t := range s.LastHour.Types {
		s.LastHour.Receipts += t.Receipts
		s.LastHour.Duplicates += t.Duplicates
	}
	if s.LastHour.Latency, err = inbox.LatencySince(ctx, o.Pool, hour); err != nil {
		return nil, err
	}
	versions, err := inbox.VersionsSince(ctx, o.Pool, now.Add(-24*time.Hour))
	if err != nil {
		return nil, err
	}
	for _, v := range versions {
		s.APIVersions = append(s.APIVersions, APIVersion{VersionCount: v, Expected: o.APIVersion == "" || v.APIVersion == o.APIVersion})
	}
	return s, nil
}

// ReceiptPage is one page of receipts, newest first. Next continues it
// (Request.After); empty on the last page.
type ReceiptPage struct {
	Receipts []inbox.Receipt `json:"receipts"`
	Count    int             `json:"count"`
	Next     string          `json:"next,omitempty"`
}

func (o *Ops) receipts(ctx context.Context, r Request) (*ReceiptPage, error) {
	limit := r.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	var after *inbox.PageKey
	if r.After != "" {
		k, err := decodeCursor(r.After)
		if err != nil {
			return nil, err
		}
		after = &k
	}
	rows, err := inbox.ListReceipts(ctx, o.Pool, o.filter(r), after, limit+1)
	if err != nil {
		return nil, err
	}
	p := &ReceiptPage{Receipts: rows}
	if len(rows) > limit {
		p.Receipts = rows[:limit]
		last := p.Receipts[limit-1]
		p.Next = encodeCursor(inbox.PageKey{ReceivedAt: last.ReceivedAt, Endpoint: last.Endpoint, EventID: last.EventID})
	}
	p.Count = len(p.Receipts)
	return p, nil
}

func encodeCursor(k inbox.PageKey) string {
	b, _ := json.Marshal(k)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (inbox.PageKey, error) {
	var k inbox.PageKey
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &k)
	}
	if err != nil || k.ReceivedAt.IsZero() || k.Endpoint == "" || k.EventID == "" {
		return k, invalidf("--after %q is not a page cursor: pass the \"next\" value of the previous page", s)
	}
	return k, nil
}

// Shown is one event: its receipts (one per endpoint that received it) and
// what it produced.
type Shown struct {
	EventID  string           `json:"event_id"`
	Receipts []inbox.Receipt  `json:"receipts"`
	Effects  handlers.Effects `json:"effects"`
}

func (o *Ops) show(ctx context.Context, r Request) (*Shown, error) {
	rs, err := inbox.ReceiptsByEventID(ctx, o.Pool, r.EventID, r.Filter.Endpoint, o.MaxAttempts, r.Payload)
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, notFound(r.EventID, r.Filter.Endpoint)
	}
	eff, err := handlers.EffectsOf(ctx, o.Pool, r.EventID, rs[0].ObjectID)
	if err != nil {
		return nil, err
	}
	return &Shown{EventID: r.EventID, Receipts: rs, Effects: eff}, nil
}

func notFound(eventID, endpoint string) *Error {
	where := ""
	if endpoint != "" {
		where = " on endpoint " + endpoint
	}
	return &Error{Kind: KindNotFound, Message: fmt.Sprintf("no receipt of event %s%s: check the id (inboxctl receipts lists the newest)", eventID, where)}
}

// RetryResult says what a retry changed (or, with DryRun, would change).
type RetryResult struct {
	DryRun bool `json:"dry_run"`
	// Count is how many receipts were (would be) retried.
	Count int `json:"count"`
	// Receipts are their keys, at most MaxListedKeys (Truncated then).
	Receipts  []ReceiptKey `json:"receipts"`
	Truncated bool         `json:"truncated,omitempty"`
	// AuditID is the ops_audit row (0 for a dry run).
	AuditID int64 `json:"audit_id,omitempty"`
}

// ReceiptKey names a receipt.
type ReceiptKey struct {
	Endpoint string `json:"endpoint"`
	EventID  string `json:"event_id"`
}

func (o *Ops) retry(ctx context.Context, r Request, c Caller) (*RetryResult, error) {
	f := o.filter(r)
	res := &RetryResult{DryRun: r.DryRun, Receipts: []ReceiptKey{}}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		keys, err := inbox.Retry(ctx, tx, f, r.DryRun)
		if err != nil {
			return err
		}
		if len(keys) == 0 && r.EventID != "" {
			// One event: an unknown id or a processed receipt is a
			// mistake, not "nothing to do".
			rs, err := inbox.ReceiptsByEventID(ctx, tx, r.EventID, r.Filter.Endpoint, o.MaxAttempts, false)
			if err != nil {
				return err
			}
			if len(rs) == 0 {
				return notFound(r.EventID, r.Filter.Endpoint)
			}
			if f.State == "" && f.EventType == "" && f.ErrorText == "" && f.Since == nil && f.Until == nil && rs[0].ProcessedAt != nil {
				return &Error{Kind: KindConflict, Message: fmt.Sprintf("event %s is processed (outcome %s at %s): its effect has committed, there is nothing to retry",
					r.EventID, rs[0].Outcome, rs[0].ProcessedAt.UTC().Format(time.RFC3339))}
			}
		}
		res.Count = len(keys)
		for i, k := range keys {
			if i == MaxListedKeys {
				res.Truncated = true
				break
			}
			res.Receipts = append(res.Receipts, ReceiptKey{Endpoint: k.Endpoint, EventID: k.EventID})
		}
		if r.DryRun {
			return nil
		}
		res.AuditID, err = recordAudit(ctx, tx, audit{Action: CmdRetry, Filter: auditFilter(r), Affected: len(keys), Reason: r.Reason, Caller: c})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, CmdRetry, r, c, res.Count, res.AuditID)
	return res, nil
}

// auditFilter is what selected the rows, as recorded.
func auditFilter(r Request) map[string]any {
	m := map[string]any{}
	if r.EventID != "" {
		m["event_id"] = r.EventID
	}
	if r.AnomalyID != 0 {
		m["anomaly_id"] = r.AnomalyID
	}
	if len(r.OutboxIDs) > 0 {
		m["outbox_ids"] = r.OutboxIDs
	}
	if r.Waiting {
		m["waiting"] = true
	}
	f := r.Filter
	for k, v := range map[string]string{"endpoint": f.Endpoint, "type": f.Type, "state": f.State, "error": f.Error} {
		if v != "" {
			m[k] = v
		}
	}
	if f.Since != nil {
		m["since"] = f.Since.UTC()
	}
	if f.Until != nil {
		m["until"] = f.Until.UTC()
	}
	return m
}

func (o *Ops) log(ctx context.Context, action string, r Request, c Caller, affected int, auditID int64) {
	if o.Logger == nil {
		return
	}
	o.Logger.InfoContext(ctx, "operator change", "action", action, "filter", auditFilter(r), "affected", affected,
		"dry_run", r.DryRun, "reason", strings.TrimSpace(r.Reason+r.Note), "actor", c.Actor, "request_id", c.RequestID, "audit_id", auditID)
}

// AnomalyList is the anomalies listed.
type AnomalyList struct {
	Anomalies []handlers.Anomaly `json:"anomalies"`
	Count     int                `json:"count"`
}

func (o *Ops) anomalies(ctx context.Context, r Request) (*AnomalyList, error) {
	limit := r.Limit
	if limit == 0 {
		limit = MaxLimit
		if r.All {
			limit = DefaultAnomalies
		}
	}
	as, err := handlers.ListAnomalies(ctx, o.Pool, r.All, limit)
	if err != nil {
		return nil, err
	}
	return &AnomalyList{Anomalies: as, Count: len(as)}, nil
}

// Resolved is a resolved anomaly and its audit row.
type Resolved struct {
	Anomaly handlers.Anomaly `json:"anomaly"`
	AuditID int64            `json:"audit_id"`
}

func (o *Ops) resolve(ctx context.Context, r Request, c Caller) (*Resolved, error) {
	res := &Resolved{}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		a, err := handlers.ResolveAnomaly(ctx, tx, r.AnomalyID, strings.TrimSpace(r.Note))
		switch {
		case errors.Is(err, handlers.ErrNoSuchAnomaly):
			return &Error{Kind: KindNotFound, Message: fmt.Sprintf("no anomaly %d: inboxctl anomalies lists the open ones", r.AnomalyID)}
		case errors.Is(err, handlers.ErrAlreadyResolved):
			return &Error{Kind: KindConflict, Message: err.Error() + "; nothing changed"}
		case err != nil:
			return err
		}
		res.Anomaly = a
		res.AuditID, err = recordAudit(ctx, tx, audit{Action: CmdResolve, Filter: auditFilter(r), Affected: 1, Reason: r.Note, Caller: c})
		return err
	})
	if err != nil {
		return nil, err
	}
	o.log(ctx, CmdResolve, r, c, 1, res.AuditID)
	return res, nil
}

// SecretsReport is, per endpoint, which signing secrets (by fingerprint)
// verified the deliveries received over the window.
type SecretsReport struct {
	WindowSeconds float64           `json:"window_seconds"`
	Since         time.Time         `json:"since"`
	Secrets       []inbox.SecretUse `json:"secrets"`
}

func (o *Ops) secrets(ctx context.Context, r Request) (*SecretsReport, error) {
	w, err := window(r.Window)
	if err != nil {
		return nil, err
	}
	since := o.Now().UTC().Add(-w)
	uses, err := inbox.SecretsSince(ctx, o.Pool, since)
	if err != nil {
		return nil, err
	}
	return &SecretsReport{WindowSeconds: w.Seconds(), Since: since, Secrets: uses}, nil
}

// FunctionName is the name the stack gives a stage's ops function
// (infra/stack); inboxctl --stage invokes it.
func FunctionName(stage string) string { return "StripeInbox-" + stage + "-ops" }
