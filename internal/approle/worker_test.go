package approle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/metrics"
	"github.com/stripe-inbox/inbox/internal/outbox"
	"github.com/stripe-inbox/inbox/internal/pgtest"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
	"github.com/stripe-inbox/inbox/internal/stripetest"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// statementLog records every statement sent on the connections it traces
// (pgx's QueryTracer and BatchTracer), with the arguments of its first use:
// the worker's real statements, to be run again.
type statementLog struct {
	mu    sync.Mutex
	order []string
	args  map[string][]any
}

func newStatementLog() *statementLog { return &statementLog{args: map[string][]any{}} }

func (l *statementLog) add(sql string, args []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.args[sql]; ok {
		return
	}
	l.order = append(l.order, sql)
	l.args[sql] = args
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL, d.Args)
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL, d.Args)
}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// transactionControl are the statements pgx and internal/batch send to
// frame transactions; replaying them would end the replay's own.
var transactionControl = regexp.MustCompile(`(?i)^\s*(begin|commit|rollback|savepoint|release)\b`)

// statements returns what was recorded, transaction control left out.
func (l *statementLog) statements() []recordedStatement {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []recordedStatement
	for _, sql := range l.order {
		if !transactionControl.MatchString(sql) {
			out = append(out, recordedStatement{sql: sql, args: l.args[sql]})
		}
	}
	return out
}

type recordedStatement struct {
	sql  string
	args []any
}

// workerPool opens a pool as the worker's role, configured as the worker
// function's (the prepared-statement cache on), that records its statements.
func (d *deployment) workerPool(t *testing.T, log *statementLog) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.dsnAs(t, d.roles.Worker))
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(d.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// live is a live-mode event (the worker below books live money).
func live(id, typ string, object map[string]any) []byte {
	return stripetest.EventWith(id, typ, stripetest.Meta{Created: stripetest.Created, Livemode: true}, object)
}

// withField returns object with key set to v.
func withField(object map[string]any, key string, v any) map[string]any {
	object[key] = v
	return object
}

// TestWorkerRoleRunsExactlyItsStatements: the worker's role (issue 23) holds
// exactly what the worker runs.
//
//  1. Every grant is used. The real worker, on a pool as its function opens
//     one, as the worker's role, drains every story the lifecycle generator
//     tells (stripetest.NewGenerator, each story twice, other-mode events
//     and twins), plus a refund booked before its invoice's link (the entry
//     moves), a payment on a void invoice (an anomaly), receipts that fail
//     to the end (backoff, review), one receipt at a time and in batches,
//     with the outbox relay publishing, failing an entry and being
//     throttled; and the resident worker's poll, LISTEN and the give-back
//     of a claim. Nothing fails. Every statement sent is recorded. Then,
//     for each privilege the role holds (read from the catalog, table and
//     column), that one privilege is revoked and the recorded statements
//     are run again, as the role, with their recorded arguments, in a
//     transaction that is rolled back: at least one of them must be
//     refused. So no grant is there that none of the worker's statements
//     needs.
//  2. Everything else is refused: DELETE anywhere, other columns of
//     webhook_inbox and ledger_entries, the reconciler's mark, the audit
//     trail, the migration ledger, sequences, temporary tables, the schema,
//     and a table a later migration creates.
func TestWorkerRoleRunsExactlyItsStatements(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	log := newStatementLog()
	pool := d.workerPool(t, log)
	webhook := d.connectAs(t, d.roles.Webhook)
	store := func(payload []byte) {
		t.Helper()
		ev, err := stripeevent.Verify(payload, stripetest.Sign(payload, time.Now(), "whsec_test"), []string{"whsec_test"})
		require.NoError(t, err)
		_, err = inbox.Store(d.ctx, webhook, "billing", ev)
		require.NoError(t, err)
	}
	discard := slog.New(slog.NewJSONHandler(io.Discard, nil))
	now := time.Now().UTC()
	newWorker := func(batchSize int) *worker.Worker {
		t.Helper()
		cfg := worker.Config{Mode: worker.ModeLive, Concurrency: 2, MaxAttempts: 2, BatchSize: batchSize, ClaimLimit: 10,
			StatementTimeout: 2 * time.Second, DeadlineMargin: 6 * time.Second, Lease: time.Minute}
		// With the sample write-back on: its intent is one of the worker's
		// statements (the superset a deployment can run).
		w, err := worker.New(pool, handlers.New(handlers.Options{Writebacks: []string{handlers.WritebackCustomerMetadata}}), cfg, discard, metrics.New(io.Discard, "Test", nil))
		require.NoError(t, err)
		w.Now = func() *time.Time { return &now }
		return w
	}
	drain := func(w *worker.Worker) {
		t.Helper()
		for round := 0; round < 6; round++ {
			s, err := w.Run(d.ctx)
			require.NoError(t, err)
			if s.Remaining == 0 {
				return
			}
			now = now.Add(time.Hour) // past every backoff
		}
		t.Fatal("the worker did not drain the inbox")
	}

	// A refund before the payment that links its charge to the invoice,
	// then failed; a payment on a void invoice; a receipt that cannot be
	// processed. Processed in batches, with the relay.
	bad := withField(stripetest.Invoice("", "cus_1", "paid", 100), "id", 42) // not an id: it fails on every attempt
	store(live("evt_refund", "charge.refunded", stripetest.ChargeWithRefunds("ch_moved", "", map[string]int64{"re_moved": 300})))
	store(live("evt_void", "invoice.voided", stripetest.Invoice("in_void", "cus_1", "void", 500)))
	store(live("evt_bad", "invoice.paid", bad))
	batches := newWorker(0)
	eb := eventbridgetest.New(t, "bus")
	var failOnce sync.Once
	eb.FailEntries(func(eventbridgetest.Entry) string {
		code := ""
		failOnce.Do(func() { code = "InternalFailure" })
		return code
	})
	relay, err := outbox.New(pool, eb.Client(func(o *eventbridge.Options) { o.RetryMaxAttempts = 1 }), outbox.Config{Bus: "bus"},
		discard, metrics.New(io.Discard, "Test", nil))
	require.NoError(t, err)
	relay.Now = func() *time.Time { return &now }
	batches.SetRelay(relay, time.Hour)
	drain(batches)
	store(live("evt_linked", "invoice.paid", withField(stripetest.Invoice("in_moved", "cus_1", "paid", 1000), "charge", "ch_moved")))
	store(live("evt_on_void", "invoice.paid", stripetest.Invoice("in_void", "cus_1", "paid", 500)))
	store(live("evt_refund_failed", "refund.updated", stripetest.RefundIn("re_moved", "ch_moved", "failed", 300)))
	eb.ThrottleCalls(1)
	drain(batches)

	// Every story, twice, half in batches and half one at a time.
	g := stripetest.NewGenerator(rand.New(rand.NewPCG(23, 2)), stripetest.Options{Livemode: true, OtherMode: true, TwinRate: 0.25, Each: true})
	events := g.Shuffled(2 * len(stripetest.Stories))
	half := len(events) / 2
	for _, ev := range events[:half] {
		store(ev.Payload)
	}
	drain(batches)
	store(live("evt_bad_alone", "invoice.paid", bad))
	for _, ev := range events[half:] {
		store(ev.Payload)
	}
	drain(newWorker(1))
	for i := 0; i < 3 && d.db.Count(t, "outbox", "published_at IS NULL") > 0; i++ {
		now = now.Add(time.Hour)
		_, err := batches.Run(d.ctx)
		require.NoError(t, err)
	}

	// The resident worker's poll and LISTEN, and the give-back of a claim
	// it did not get to (inbox.Release).
	store(live("evt_given_back", "invoice.created", stripetest.Invoice("in_given_back", "cus_1", "draft", 100)))
	conn, err := pool.Acquire(d.ctx)
	require.NoError(t, err)
	defer conn.Release()
	ok, err := inbox.Claimable(d.ctx, conn, 2, nil, time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, inbox.Listen(d.ctx, conn.Conn()))
	claimed, err := inbox.Claim(d.ctx, conn, inbox.ClaimParams{MaxAttempts: 2, Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "%+v", claimed)
	released, err := inbox.Release(d.ctx, conn, claimed, nil)
	require.NoError(t, err)
	require.Equal(t, 1, released)

	// What the worker did, as its role: all booked, nothing refused.
	require.Equal(t, 0, d.db.Count(t, "webhook_inbox", "last_error ILIKE '%permission denied%'"), "%v", deniedErrors(t, d))
	require.Equal(t, 2, d.db.Count(t, "webhook_inbox", "processed_at IS NULL AND event_id LIKE 'evt_bad%' AND attempts = 2 AND available_at = 'infinity'"),
		"the receipts that cannot be processed wait for review")
	require.Equal(t, 1, d.db.Count(t, "webhook_inbox", "processed_at IS NULL AND event_id = 'evt_given_back'"))
	require.Equal(t, 3, d.db.Count(t, "webhook_inbox", "processed_at IS NULL"), "every other receipt is processed")
	require.Equal(t, 1, d.db.Count(t, "ledger_entries", "invoice_id = 'in_moved' AND kind = 'refund:re_moved' AND amount = -300"), "the refund moved to its invoice")
	require.Equal(t, 1, d.db.Count(t, "ledger_entries", "invoice_id = 'in_moved' AND kind = 'refund_reversal:re_moved' AND amount = 300"))
	require.Equal(t, 1, d.db.Count(t, "anomalies", "kind = 'payment_on_void_invoice' AND subject_id = 'in_void'"))
	require.Equal(t, 1, d.db.Count(t, "ledger_entries", "invoice_id = 'in_void' AND kind = 'payment' AND amount = 500"), "a payment on a void invoice is booked")
	require.Equal(t, 0, d.db.Count(t, "outbox", "published_at IS NULL"), "the relay published every row")
	require.Positive(t, d.db.Count(t, "outbox", "published_at IS NOT NULL AND attempts > 1"), "published after a failed entry")

	stmts := log.statements()
	all := make([]string, len(stmts))
	for i, s := range stmts {
		all[i] = s.sql
	}
	joined := strings.Join(all, "\n;\n")
	// Each of the worker's statements ran (a fragment of each, from
	// internal/inbox, internal/handlers and internal/outbox queries.go),
	// but invoiceStatus, which runs only when a concurrent transaction
	// changed the invoice after payInvoice's snapshot; it reads status FOR
	// UPDATE, which payInvoice's statement needs too.
	for _, fragment := range []string{
		"SET attempts     = w.attempts + 1",                // inbox claimReceipts
		"SELECT EXISTS (\n    SELECT 1 FROM webhook_inbox", // claimable
		"   FOR UPDATE OF w",                               // lockReceipts
		"   AND processed_at IS NULL\n   FOR UPDATE",       // lockReceipt
		"outcome      = k.outcome",                         // markManyProcessed
		"outcome      = $4",                                // markProcessed
		"SET last_error   = $4",                            // recordFailure
		"SET available_at = 'infinity'\n  FROM",            // parkNeedsReview
		"greatest(w.attempts - 1, 0)",                      // releaseClaims
		"FROM webhook_inbox\n WHERE processed_at IS NULL",  // backlogStats
		"LISTEN ",
		"SELECT count(*) FROM anomalies WHERE resolved_at IS NULL", // handlers countUnresolvedAnomalies
		"SELECT id, k.kind, k.amount",                              // payInvoice
		"INSERT INTO refunds AS r",                                 // applyRefunds
		"UPDATE refunds AS x",                                      // attributeRefunds
		"WITH linked AS (\nINSERT INTO payment_links",              // linkPayments
		"INSERT INTO anomalies",                                    // raiseAnomaly
		"INSERT INTO writeback_intents",                            // payInvoice's intent (write-backs on)
		"claim_token  = $5::uuid",                                  // outbox claimRows
		"SET published_at",                                         // markPublished
		"last_error = f.error",                                     // recordFailures
		"last_error = coalesce($3, last_error)",                    // releaseRows
		"attempts used up",                                         // parkExhausted
		"FROM outbox\n WHERE published_at IS NULL",                 // backlog
	} {
		require.True(t, strings.Contains(joined, fragment), "the worker never sent %q", fragment)
	}
	standalone := false
	for _, s := range all {
		if strings.HasPrefix(strings.TrimSpace(s), "INSERT INTO invoices AS i") {
			standalone = true // upsertInvoice on its own
		}
	}
	require.True(t, standalone, "upsertInvoice ran")

	// 1. Each privilege the role holds is needed by a statement.
	master := d.connectAs(t, d.master)
	_, err = master.Exec(d.ctx, "SET ROLE "+pgx.Identifier{d.roles.Owner}.Sanitize())
	require.NoError(t, err)
	replay := d.connectAs(t, d.roles.Worker)
	require.Empty(t, refused(t, d.ctx, replay, stmts), "with every grant, nothing is refused")
	privileges := workerPrivileges(t, d)
	require.Greater(t, len(privileges), 20)
	for _, p := range privileges {
		role := pgx.Identifier{p.role}.Sanitize()
		_, err := master.Exec(d.ctx, "REVOKE "+p.on()+" FROM "+role)
		require.NoError(t, err)
		denied := refused(t, d.ctx, replay, stmts)
		_, err = master.Exec(d.ctx, "GRANT "+p.on()+" TO "+role)
		require.NoError(t, err)
		require.NotEmpty(t, denied, "no statement of the worker needs %s: take it out of workerGrants", p)
	}

	// 2. Everything else is refused.
	conn2 := d.connectAs(t, d.roles.Worker)
	var denied []string
	for _, table := range []string{"webhook_inbox", "invoices", "ledger_entries", "refunds", "payment_links", "anomalies", "outbox",
		"disputes", "writeback_intents", "reconcile_high_water", "ops_audit", "schema_migrations"} {
		denied = append(denied, "DELETE FROM "+table, "TRUNCATE "+table)
	}
	requireDenied(t, conn2, denied...)
	requireDenied(t, conn2,
		`INSERT INTO webhook_inbox (provider, endpoint, event_id, event_type, livemode, payload)
			VALUES ('stripe', 'billing', 'evt_x', 'invoice.paid', false, '{}')`,
		"UPDATE webhook_inbox SET payload = '{}'",
		"UPDATE webhook_inbox SET payload_raw = NULL",
		"UPDATE webhook_inbox SET event_type = 'x'",
		"UPDATE webhook_inbox SET received_at = now()",
		"UPDATE webhook_inbox SET duplicates = 0",
		"UPDATE webhook_inbox SET source = 'webhook'",
		"UPDATE webhook_inbox SET livemode = true",
		"SELECT secret_fingerprint FROM webhook_inbox",
		"UPDATE ledger_entries SET amount = 0",
		"UPDATE ledger_entries SET kind = 'payment'",
		"UPDATE ledger_entries SET event_id = 'evt_x'",
		"UPDATE ledger_entries SET currency = 'eur'",
		"SELECT id FROM ledger_entries",
		"UPDATE anomalies SET resolved_at = now(), resolution = 'x'",
		"UPDATE outbox SET payload = '{}'",
		"UPDATE outbox SET event_type = 'x'",
		"SELECT 1 FROM reconcile_high_water",
		"INSERT INTO reconcile_high_water (provider, endpoint, high_water) VALUES ('stripe', 'billing', now())",
		"UPDATE reconcile_high_water SET high_water = now()",
		"SELECT 1 FROM ops_audit",
		"INSERT INTO ops_audit (action, filter, affected, reason, actor) VALUES ('retry', '{}', 0, 'x', 'x')",
		"SELECT 1 FROM schema_migrations",
		"SELECT nextval(pg_get_serial_sequence('ledger_entries', 'id'))",
		"CREATE TEMP TABLE scratch (id int)",
	)
	requireDenied(t, conn2, ddl...)
}

// refused runs the statements on conn as they were recorded, each under a
// savepoint, in a transaction that is rolled back, and returns the ones
// PostgreSQL refused for want of a privilege (42501). Privileges are checked
// when a statement starts, whatever rows it then finds.
func refused(t *testing.T, ctx context.Context, conn *pgx.Conn, stmts []recordedStatement) []string {
	t.Helper()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(ctx)) }()
	var out []string
	for _, s := range stmts {
		_, err := tx.Exec(ctx, "SAVEPOINT replay")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, s.sql, s.args...)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			out = append(out, s.sql)
		}
		_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT replay")
		require.NoError(t, err)
	}
	return out
}

// privilege is one privilege the worker's role holds: on a table, or on one
// of its columns.
type privilege struct {
	table, column, kind, role string
}

// on is the privilege as GRANT and REVOKE name it: KIND [(column)] ON table.
func (p privilege) on() string {
	col := ""
	if p.column != "" {
		col = " (" + pgx.Identifier{p.column}.Sanitize() + ")"
	}
	return fmt.Sprintf("%s%s ON public.%s", p.kind, col, pgx.Identifier{p.table}.Sanitize())
}

func (p privilege) String() string {
	if p.column == "" {
		return p.kind + " on " + p.table
	}
	return p.kind + " of " + p.table + "." + p.column
}

// workerPrivileges lists every privilege the worker's role holds on schema
// public's relations, from the catalog.
func workerPrivileges(t *testing.T, d *deployment) []privilege {
	t.Helper()
	rows, err := d.db.Pool.Query(d.ctx, `
SELECT c.relname, '', a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = (SELECT oid FROM pg_roles WHERE rolname = $1)
UNION ALL
SELECT c.relname, att.attname, a.privilege_type
  FROM pg_class c JOIN pg_attribute att ON att.attrelid = c.oid, aclexplode(att.attacl) a
 WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = (SELECT oid FROM pg_roles WHERE rolname = $1)
 ORDER BY 1, 3, 2`, d.roles.Worker)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (privilege, error) {
		p := privilege{role: d.roles.Worker}
		return p, r.Scan(&p.table, &p.column, &p.kind)
	})
	require.NoError(t, err)
	return out
}

// TestUpgradedWorkerRoleEndsWithTheSameGrants: a database the earlier
// release's deploy step granted (the worker could select, insert, update and
// delete every table and use every sequence, today's and, through default
// privileges, later ones', and create temporary tables) ends, after this
// release's deploy, with exactly the privileges a new database gets.
func TestUpgradedWorkerRoleEndsWithTheSameGrants(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, pgtest.Empty(t))
	d.deploy(t)
	fresh := workerPrivilegeState(t, d)
	require.NotContains(t, fresh, "TEMPORARY")
	require.Contains(t, fresh, "UPDATE of webhook_inbox.outcome")

	// What the earlier release's Grant gave the worker, as the owner.
	master := d.connectAs(t, d.master)
	owner, worker := pgx.Identifier{d.roles.Owner}.Sanitize(), pgx.Identifier{d.roles.Worker}.Sanitize()
	for _, q := range []string{
		"SET ROLE " + owner,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + worker,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO " + worker,
		"REVOKE INSERT, DELETE ON public.webhook_inbox FROM " + worker,
		"REVOKE ALL ON public.schema_migrations FROM " + worker,
		"REVOKE ALL ON public.ops_audit FROM " + worker,
		"ALTER DEFAULT PRIVILEGES FOR ROLE " + owner + " IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO " + worker,
		"ALTER DEFAULT PRIVILEGES FOR ROLE " + owner + " IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO " + worker,
		"RESET ROLE",
		"GRANT TEMPORARY ON DATABASE " + pgx.Identifier{d.db.Name}.Sanitize() + " TO " + worker,
	} {
		_, err := master.Exec(d.ctx, q)
		require.NoError(t, err, q)
	}
	earlier := workerPrivilegeState(t, d)
	require.Contains(t, earlier, "DELETE on ledger_entries")
	require.Contains(t, strings.Join(earlier, "\n"), "default privileges r DELETE")
	require.Contains(t, earlier, "TEMPORARY")

	d.deploy(t)
	require.Equal(t, fresh, workerPrivilegeState(t, d))
}

// workerPrivilegeState is everything the worker's role may do in the
// database, one line each: table and column privileges, sequences, default
// privileges for it, and temporary tables.
func workerPrivilegeState(t *testing.T, d *deployment) []string {
	t.Helper()
	var out []string
	for _, p := range workerPrivileges(t, d) {
		out = append(out, p.String())
	}
	rows, err := d.db.Pool.Query(d.ctx, `
SELECT 'sequence ' || c.relname FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
   AND CASE WHEN c.relkind = 'S' THEN has_sequence_privilege($1, c.oid, 'USAGE, SELECT, UPDATE') END
UNION ALL
SELECT 'default privileges ' || d.defaclobjtype::text || ' ' || a.privilege_type
  FROM pg_default_acl d, aclexplode(d.defaclacl) a
 WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = $1)
UNION ALL
SELECT 'TEMPORARY' WHERE has_database_privilege($1, current_database(), 'TEMPORARY')
 ORDER BY 1`, d.roles.Worker)
	require.NoError(t, err)
	more, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return append(out, more...)
}

// deniedErrors are the distinct permission errors the worker recorded, for a
// failure message that names the missing grant.
func deniedErrors(t *testing.T, d *deployment) []string {
	rows, err := d.db.Pool.Query(d.ctx, "SELECT DISTINCT last_error FROM webhook_inbox WHERE last_error ILIKE '%permission denied%'")
	require.NoError(t, err)
	errs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return errs
}
