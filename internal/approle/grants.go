package approle

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// WorkerStateColumns are the columns of webhook_inbox that only the worker
// writes (claims, attempts, outcomes). The webhook may insert every other
// column, including columns later migrations add; a migration that adds a
// column only the worker may write must add it here.
var WorkerStateColumns = []string{"received_at", "available_at", "attempts", "last_error", "processed_at", "outcome"}

// DeliveryReplaces are the columns of webhook_inbox the endpoint's delivery
// replaces in a receipt the reconciler listed first (inbox.Store,
// migrations/0014_listed_first.sql): the webhook may update these, and no
// other but duplicates.
var DeliveryReplaces = []string{"payload", "payload_raw", "api_version", "secret_fingerprint", "signed_at", "source", "listed_first"}

// receiptKey is the part of a receipt the webhook may read back.
var receiptKey = []string{"provider", "endpoint", "event_id"}

// Grant is the deploy step's last part, run after the migrations: as the
// owner (SET LOCAL ROLE, so the grants are the owner's), in one transaction,
// it takes every privilege on schema public's tables and sequences, and every
// default privilege the owner set, from the login roles and the retired
// roles, and grants each login role exactly what its function needs (see the
// package comment). No login role gets default privileges: a table a later
// migration creates is nobody's until a release grants it here. The
// legacy role, if it exists, gets back what the earlier release gave it, on
// every table, including those created since.
// Running it after each deploy's migrations is what lets the webhook insert
// columns later migrations add to webhook_inbox. conn must be the master's.
func Grant(ctx context.Context, conn *pgx.Conn, roles Roles) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("taking the role lock: %w", err)
		}
		var master string
		if err := tx.QueryRow(ctx, "SELECT current_user").Scan(&master); err != nil {
			return fmt.Errorf("reading the current user: %w", err)
		}
		if err := roles.Validate(master); err != nil {
			return err
		}
		owner := pgx.Identifier{roles.Owner}.Sanitize()
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+owner); err != nil {
			return fmt.Errorf("becoming the owner %s: %w", roles.Owner, err)
		}
		columns, err := webhookColumns(ctx, tx)
		if err != nil {
			return err
		}
		// A retired role that never existed here (a stack created after
		// it was retired) has nothing to revoke.
		var retired []string
		if err := tx.QueryRow(ctx, "SELECT coalesce(array_agg(rolname ORDER BY rolname), '{}') FROM pg_roles WHERE rolname = ANY ($1)",
			roles.Retired).Scan(&retired); err != nil {
			return fmt.Errorf("looking up the retired roles: %w", err)
		}
		roles.Retired = retired
		// Nor does a legacy role that never existed (a new stack): it is
		// not created, so it gets nothing.
		if roles.Legacy != "" {
			exists, err := roleExists(ctx, tx, roles.Legacy)
			if err != nil {
				return err
			}
			if !exists {
				roles.Legacy = ""
			}
		}
		for _, stmt := range grants(roles, columns) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("granting privileges (%s): %w", stmt, err)
			}
		}
		return nil
	})
}

// webhookColumns lists the columns of webhook_inbox the webhook may insert:
// all but WorkerStateColumns.
func webhookColumns(ctx context.Context, tx pgx.Tx) ([]string, error) {
	rows, err := tx.Query(ctx, `
SELECT attname FROM pg_attribute
 WHERE attrelid = 'public.webhook_inbox'::regclass AND attnum > 0 AND NOT attisdropped
   AND attgenerated = ''
 ORDER BY attnum`)
	if err != nil {
		return nil, fmt.Errorf("listing the columns of webhook_inbox: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing the columns of webhook_inbox: %w", err)
	}
	var out []string
	for _, c := range all {
		if !slices.Contains(WorkerStateColumns, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// grants are the statements, run as the owner, that give each login role
// exactly its function's privileges and take everything from retired roles.
func grants(roles Roles, webhookInsert []string) []string {
	q := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	owner, webhook, worker, purge := q(roles.Owner), q(roles.Webhook), q(roles.Worker), q(roles.Purge)
	var out []string
	// Start from nothing, so a privilege an earlier release (or an
	// operator) granted does not linger.
	all := append([]string{roles.Webhook, roles.Worker, roles.Purge}, roles.Retired...)
	if roles.Legacy != "" {
		all = append(all, roles.Legacy)
	}
	if roles.Ops != "" {
		all = append(all, roles.Ops)
	}
	if roles.Reconcile != "" {
		all = append(all, roles.Reconcile)
	}
	if roles.Ingest != "" {
		all = append(all, roles.Ingest)
	}
	if roles.Writeback != "" {
		all = append(all, roles.Writeback)
	}
	for _, name := range all {
		r := q(name)
		out = append(out,
			"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "+r,
			"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM "+r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public REVOKE ALL ON TABLES FROM "+r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public REVOKE ALL ON SEQUENCES FROM "+r,
		)
	}
	out = append(out,
		// The webhook: store a receipt, and read back only its key (the
		// INSERT ... ON CONFLICT DO NOTHING RETURNING of internal/inbox).
		"GRANT INSERT ("+quoteAll(webhookInsert)+") ON public.webhook_inbox TO "+webhook,
		"GRANT SELECT ("+quoteAll(receiptKey)+") ON public.webhook_inbox TO "+webhook,
		// A duplicate delivery counts itself on the stored receipt
		// (inbox.CountDuplicate: UPDATE ... SET duplicates = duplicates + 1,
		// its row picked FOR UPDATE SKIP LOCKED): UPDATE and SELECT of that
		// one column.
		"GRANT SELECT (duplicates), UPDATE (duplicates) ON public.webhook_inbox TO "+webhook,
		// The endpoint's delivery of an event the reconciler listed first
		// replaces the listed copy while the receipt is unprocessed
		// (inbox.Store: INSERT ... ON CONFLICT DO UPDATE SET <these> WHERE
		// source = 'reconcile' AND processed_at IS NULL RETURNING
		// listed_first): UPDATE of the columns it sets, SELECT of the two it
		// tests and the one it returns. Not SELECT of payload: the statement
		// sets the columns from its parameters, not from EXCLUDED.
		"GRANT UPDATE ("+quoteAll(DeliveryReplaces)+") ON public.webhook_inbox TO "+webhook,
		"GRANT SELECT (source, processed_at, listed_first) ON public.webhook_inbox TO "+webhook,

		// The purge (internal/retention): delete processed receipts and
		// published outbox rows, scrub payloads. Its batches pick rows by
		// ctid, which a column grant cannot cover, so SELECT is the table's.
		// They lock the rows they pick (FOR UPDATE SKIP LOCKED), which
		// PostgreSQL allows only with UPDATE on at least one column: on
		// webhook_inbox that is payload and payload_raw (scrubbing), on outbox created_at,
		// the one column whose change neither the dispatcher (payload,
		// published_at) nor the retention (published_at) reads.
		"GRANT SELECT, DELETE ON public.webhook_inbox, public.outbox TO "+purge,
		"GRANT UPDATE (payload, payload_raw) ON public.webhook_inbox TO "+purge,
		"GRANT UPDATE (created_at) ON public.outbox TO "+purge,
		// Done write-back intents past the retention
		// (internal/writeback.PurgeDone): the columns its DELETE tests.
		"GRANT SELECT (id, status, done_at), DELETE ON public.writeback_intents TO "+purge,
	)
	// The worker: exactly its statements, nothing by default.
	out = append(out, workerGrants(worker)...)
	if roles.Ops != "" {
		out = append(out, opsGrants(q(roles.Ops))...)
	}
	if roles.Reconcile != "" {
		// The reconciler's store function (internal/reconcile.DBSink):
		// the webhook's INSERT with source 'reconcile', and its mark.
		reconcile := q(roles.Reconcile)
		out = append(out,
			"GRANT INSERT ("+quoteAll(webhookInsert)+") ON public.webhook_inbox TO "+reconcile,
			"GRANT SELECT ("+quoteAll(receiptKey)+") ON public.webhook_inbox TO "+reconcile,
			"GRANT SELECT, INSERT, UPDATE ON public.reconcile_high_water TO "+reconcile,
		)
	}
	if roles.Ingest != "" {
		// The EventBridge ingest function (internal/ingest): the
		// webhook's store statement with source 'eventbridge', which
		// inserts a receipt or replaces a copy the reconciler listed
		// first (the content guard of migrations/0014 and 0020 admits
		// nothing else), and reads back the key and the columns the
		// statement tests. Not duplicates (it does not count them), no
		// payload, nothing else.
		ingest := q(roles.Ingest)
		out = append(out,
			"GRANT INSERT ("+quoteAll(webhookInsert)+") ON public.webhook_inbox TO "+ingest,
			"GRANT SELECT ("+quoteAll(receiptKey)+") ON public.webhook_inbox TO "+ingest,
			"GRANT UPDATE ("+quoteAll(DeliveryReplaces)+") ON public.webhook_inbox TO "+ingest,
			"GRANT SELECT (source, processed_at, listed_first) ON public.webhook_inbox TO "+ingest,
		)
	}
	if roles.Writeback != "" {
		out = append(out, writebackGrants(q(roles.Writeback))...)
	}
	if roles.Legacy != "" {
		// The earlier release's shared role, while it is kept: what that
		// release's deploy step granted it (the functions it ran did all
		// three jobs), on every table the owner now owns, including tables
		// created since (refunds, payment_links) and later ones. So the
		// previous functions keep working during the deploy and after a
		// rollback, whatever migrations this release applied.
		legacy := q(roles.Legacy)
		out = append(out,
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+legacy,
			"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "+legacy,
			"REVOKE INSERT, UPDATE, DELETE ON public.schema_migrations FROM "+legacy,
			"REVOKE INSERT, UPDATE, DELETE ON public.ops_audit FROM "+legacy,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+legacy,
			"ALTER DEFAULT PRIVILEGES FOR ROLE "+owner+" IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO "+legacy,
		)
	}
	return out
}

// workerGrants are the worker's privileges: exactly the statements it runs
// (internal/inbox's claim, lock, mark, fail, park, release and backlog;
// internal/handlers' statements, with the outbox INSERT they compose;
// internal/outbox's relay), table by table and column by column, so that a
// column or table a later migration adds is not the worker's until a
// release grants it here (TestWorkerRoleRunsExactlyItsStatements proves
// each of these is used and nothing else is allowed). It parses outside
// input, so what a compromised worker could do is bounded by this list:
//
//   - no DELETE anywhere, no TRUNCATE, no sequence (the tables' ids are
//     identity columns, which need none);
//   - on webhook_inbox, no INSERT (receipts are the webhook's) and UPDATE
//     only of its processing state: attempts and available_at (claim,
//     release, backoff, parking), last_error (failure), processed_at and
//     outcome (mark); never a receipt's content;
//   - on ledger_entries, INSERT of a new entry and UPDATE of invoice_id
//     only (refundEntries moves a refund's entries to its invoice), never
//     an amount, a kind or the receipt an entry came from;
//   - on outbox, INSERT of a row and UPDATE of the relay's columns, never
//     a row's payload or event type;
//   - nothing on reconcile_high_water, ops_audit or schema_migrations.
//
// SELECT is granted on the columns the statements read (their WHERE,
// ON CONFLICT, RETURNING and lock keys), so on webhook_inbox not the
// signature's fingerprint, signing time or duplicate count.
func workerGrants(worker string) []string {
	return append([]string{
		// internal/inbox (queries.go): claimReceipts, claimable,
		// lockReceipt(s), markProcessed, markManyProcessed,
		// recordFailure, parkNeedsReview, releaseClaims, backlogStats.
		"GRANT SELECT (provider, endpoint, event_id, event_type, api_version, livemode, account, object_id, payload, payload_raw, " +
			"received_at, available_at, attempts, processed_at, source) ON public.webhook_inbox TO " + worker,
		"GRANT UPDATE (attempts, available_at, last_error, processed_at, outcome) ON public.webhook_inbox TO " + worker,
		// internal/handlers (queries.go): upsertInvoice and payInvoice
		// (the invoice's upsert), invoiceStatus.
		"GRANT SELECT (id, account, status, customer_id, currency, amount_due, amount_paid, paid_at, snapshot_created, snapshot_rank, snapshot_event_id) ON public.invoices TO " + worker,
		"GRANT INSERT (id, account, customer_id, status, currency, amount_due, amount_paid, paid_at, snapshot_created, snapshot_rank, snapshot_event_id) ON public.invoices TO " + worker,
		"GRANT UPDATE (status, customer_id, currency, amount_due, amount_paid, paid_at, snapshot_created, snapshot_rank, snapshot_event_id, updated_at) ON public.invoices TO " + worker,
		// payInvoice's booking (RETURNING kind), refundEntries and
		// disputeEntries (move an entry: ON CONFLICT (kind, account) DO
		// UPDATE SET invoice_id WHERE the invoice differs; disputeEntries
		// returns the entries it booked for their outbox rows).
		"GRANT SELECT (invoice_id, kind, account, amount, currency, event_id) ON public.ledger_entries TO " + worker,
		"GRANT INSERT (invoice_id, kind, account, amount, currency, event_id) ON public.ledger_entries TO " + worker,
		"GRANT UPDATE (invoice_id) ON public.ledger_entries TO " + worker,
		// applyRefunds and attributeRefunds.
		"GRANT SELECT (id, account, charge_id, payment_intent_id, invoice_id, booked_under, amount, currency, status, succeeded) ON public.refunds TO " + worker,
		"GRANT INSERT (id, account, charge_id, payment_intent_id, invoice_id, amount, currency, status, succeeded) ON public.refunds TO " + worker,
		"GRANT UPDATE (charge_id, payment_intent_id, invoice_id, currency, status, succeeded, updated_at) ON public.refunds TO " + worker,
		// linkPayments (and payInvoice's), applyRefunds' links, and the
		// claim's lock key (internal/inbox lockKey).
		"GRANT SELECT (payment_id, account, invoice_id, has_refunds) ON public.payment_links TO " + worker,
		"GRANT INSERT (payment_id, account, invoice_id, has_refunds) ON public.payment_links TO " + worker,
		"GRANT UPDATE (invoice_id, has_refunds, updated_at) ON public.payment_links TO " + worker,
		// raiseAnomaly, and countUnresolvedAnomalies (the AnomalyCount
		// metric). Never resolved_at: that is the operators'.
		"GRANT SELECT (kind, subject_id, account, resolved_at) ON public.anomalies TO " + worker,
		"GRANT INSERT (kind, subject_id, account, endpoint, event_id, detail) ON public.anomalies TO " + worker,
		// The handlers' outbox row (outbox.InsertRowsSQL) and the relay
		// (internal/outbox queries.go: claimRows, markPublished,
		// recordFailures, releaseRows, parkExhausted, backlog).
		"GRANT SELECT (id, aggregate_type, aggregate_id, event_type, payload, created_at, published_at, attempts, available_at, claim_token, last_error) ON public.outbox TO " + worker,
		"GRANT INSERT (aggregate_type, aggregate_id, event_type, payload) ON public.outbox TO " + worker,
		"GRANT UPDATE (attempts, available_at, leased_until, claim_token, last_error, published_at) ON public.outbox TO " + worker,
		// payInvoice's write-back intent (internal/handlers writebacks.go):
		// INSERT only, ON CONFLICT (idempotency_key) DO NOTHING. Only the
		// statements used with a write-back on name the table, but the
		// grant does not depend on WRITEBACKS: turning one on needs no new
		// grant. Sending and recording are the sender's (internal/writeback).
		"GRANT SELECT (idempotency_key) ON public.writeback_intents TO " + worker,
		"GRANT INSERT (kind, target, params, idempotency_key, event_id) ON public.writeback_intents TO " + worker,
	}, workerDisputeGrants(worker)...)
}

// opsGrants are the operators' role's privileges: exactly the statements of
// internal/ops (its reads, retry, resolve and the audit row). Table by
// table, so a table a later migration adds is not readable until a release
// decides it should be. The audit rows' identity column needs no sequence
// privilege.
func opsGrants(ops string) []string {
	return []string{
		"GRANT SELECT ON public.webhook_inbox, public.invoices, public.ledger_entries, public.outbox, public.anomalies TO " + ops,
		"GRANT UPDATE (attempts, available_at) ON public.webhook_inbox TO " + ops,
		"GRANT UPDATE (resolved_at, resolution) ON public.anomalies TO " + ops,
		// outbox-retry (outbox.RetryRows): fresh attempts, due now, no
		// lease; never published_at, the payload or last_error.
		"GRANT UPDATE (attempts, available_at, leased_until, claim_token) ON public.outbox TO " + ops,
		"GRANT SELECT, INSERT ON public.ops_audit TO " + ops,
		// writebacks, writeback, writeback-retry (writeback.RetryParked):
		// a parked intent made due with fresh attempts; never its result,
		// key, parameters or first attempt.
		"GRANT SELECT ON public.writeback_intents TO " + ops,
		"GRANT UPDATE (status, attempts, available_at, leased_until, claim_token, key_generation, refused) ON public.writeback_intents TO " + ops,
	}
}

// writebackGrants are the write-back store function's
// (internal/writeback.DBStore: claimIntents, recordDone, recordRetry,
// recordParked, backlog), column by column: it reads what its statements
// test and return, and updates the sender's columns. It cannot insert an
// intent (the worker's, in the booking's transaction), delete one, change
// what an intent asks for (kind, target, params, idempotency_key,
// key_generation), read the receipt it came from, or touch any other
// table. Its claim locks rows FOR UPDATE SKIP LOCKED, which its UPDATE
// privilege allows.
func writebackGrants(writeback string) []string {
	return []string{
		"GRANT SELECT (" + quoteAll(WritebackReads) + ") ON public.writeback_intents TO " + writeback,
		"GRANT UPDATE (" + quoteAll(WritebackUpdates) + ") ON public.writeback_intents TO " + writeback,
	}
}

// WritebackReads are the writeback_intents columns the write-back store
// reads: the claim's tests and what it returns, the record statements'
// WHERE, the backlog's.
var WritebackReads = []string{"id", "kind", "target", "params", "idempotency_key", "key_generation", "status", "attempts",
	"available_at", "first_attempt_at", "claim_token", "result_via", "created_at"}

// WritebackUpdates are the writeback_intents columns the write-back store
// sets: the claim's (attempt, lease, token) and the outcomes'.
var WritebackUpdates = []string{"attempts", "first_attempt_at", "last_attempt_at", "leased_until", "available_at", "claim_token",
	"status", "done_at", "result_id", "result", "result_via", "last_error", "refused"}
