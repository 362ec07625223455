package inbox

import (
	"strconv"
	"strings"
)

// Every statement that touches webhook_inbox: the webhook's store, the
// worker's claim, lock, mark, fail and release, and the purge's delete and
// scrub. Parameters are positional ($1, $2, ...); each query documents its
// parameters. The webhook sends them without a prepared-statement cache, the
// worker with one (see internal/database).

// storeDelivery: the webhook's store. $1 provider, $2 endpoint, $3
// event_id, $4 event_type, $5 api_version, $6 livemode, $7 account,
// $8 object_id, $9 payload (text), $10 payload_raw (bytea, NULL unless jsonb
// cannot hold the exact bytes; see migrations/0007_receipt_payload_raw.sql),
// $11 secret_fingerprint (the fingerprint of the signing secret that
// verified it), $12 signed_at (the signature's timestamp; see
// migrations/0012_ops.sql), $13 source ('webhook', or 'eventbridge' for
// the same endpoint's delivery through Amazon EventBridge, internal/ingest;
// migrations/0020_eventbridge_source.sql).
//
// One statement, its own transaction. A new event is inserted (source
// $13). An event the reconciler listed first (source 'reconcile',
// storeListed) whose receipt is still unprocessed gets the delivery's copy:
// the endpoint's delivery is the copy that counts (its API version is the
// endpoint's; a listed event's is the one the account had when it was
// created), so its payload, payload_raw, api_version, fingerprint and
// signing time replace the listed ones, source becomes $13 and
// listed_first records that the reconciler had it first
// (migrations/0014_listed_first.sql). Anything else is a duplicate and
// changes nothing. The values come from the parameters, not from EXCLUDED:
// reading EXCLUDED.payload would need SELECT on payload, which the
// webhook's role must not have (internal/approle).
//
// Concurrency. ON CONFLICT DO UPDATE locks the existing row and evaluates
// the WHERE on its latest version: while a worker holds the receipt (its
// processing transaction locks the row), the delivery waits for it (bounded
// by the webhook's store timeout); if the worker committed, the receipt is
// processed and the delivery is a duplicate; if it rolled back, the
// delivery's copy replaces the listed one and is what the next attempt
// books. A concurrent first insert of the same event (the reconciler's, or
// another delivery's) is waited for on the primary key, as before. The
// worker's columns (attempts, available_at, last_error, ...) are left as
// they are: a receipt that waits for review keeps waiting, now with the
// delivery's copy.
//
// Returns listed_first: false for a new receipt, true when the delivery
// replaced a listed copy; no row for a duplicate.
const storeDelivery = `
INSERT INTO webhook_inbox AS w
    (provider, endpoint, event_id, event_type, api_version, livemode, account, object_id, payload, payload_raw, secret_fingerprint, signed_at, source)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10::bytea, $11, $12, $13)
ON CONFLICT (provider, endpoint, event_id) DO UPDATE
   SET payload            = $9::jsonb,
       payload_raw        = $10::bytea,
       api_version        = $5,
       secret_fingerprint = $11,
       signed_at          = $12,
       source             = $13,
       listed_first       = true
 WHERE w.source = 'reconcile'
   AND w.processed_at IS NULL
RETURNING w.listed_first`

// storeListed: the reconciler's store, parameters as storeDelivery ($13 is
// always 'reconcile'). An event
// listed on the Events API that the inbox does not have yet is stored with
// source 'reconcile' and listed_first; an event the inbox has is a duplicate
// and changes nothing (a listed copy never replaces a delivery, nor another
// listed copy). Returns a row when the receipt is new.
const storeListed = `
INSERT INTO webhook_inbox
    (provider, endpoint, event_id, event_type, api_version, livemode, account, object_id, payload, payload_raw, secret_fingerprint, signed_at, source, listed_first)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10::bytea, $11, $12, $13, true)
ON CONFLICT (provider, endpoint, event_id) DO NOTHING
RETURNING false`

// NotifyChannel is the channel a stored receipt is announced on
// (storeDeliveryNotify) and resident workers LISTEN on (listenReceipts). The
// payload is empty: a notification only says "claim now"; the claim reads
// what there is.
const NotifyChannel = "webhook_inbox"

// storeDeliveryNotify is storeDelivery that also sends a notification on
// NotifyChannel, in the same statement and so in the same transaction:
// PostgreSQL delivers it when the receipt commits, and never for a receipt
// that rolled back. Only a stored or replaced receipt notifies (the scalar
// subquery runs once per returned row; a duplicate returns none). pg_notify
// is granted to PUBLIC: the webhook's role needs nothing more. It costs
// throughput: a transaction that notified takes a database-wide lock while
// it commits, so notifying inserts commit one at a time (pgbench, 16
// clients, fsync on: about a third of the plain INSERT's rate). Hence NOTIFY
// is a setting. Parameters and result as storeDelivery.
const storeDeliveryNotify = `
WITH stored AS (` + storeDelivery + `
)
SELECT listed_first, (SELECT true FROM pg_notify('` + NotifyChannel + `', '')) FROM stored`

// listenReceipts registers the session for NotifyChannel.
const listenReceipts = "LISTEN " + NotifyChannel

// countDuplicate: $1 provider, $2 endpoint, $3 event_id. The webhook's count
// of a delivery it answered "duplicate" (inboxctl status). It never waits: a
// receipt whose row a worker holds (processing it) is skipped, and that
// duplicate goes uncounted, so the count can never delay an answer to
// Stripe. Returns a row when it counted.
const countDuplicate = `
UPDATE webhook_inbox SET duplicates = duplicates + 1
 WHERE (provider, endpoint, event_id) = (
       SELECT provider, endpoint, event_id FROM webhook_inbox
        WHERE provider = $1 AND endpoint = $2 AND event_id = $3
          FOR UPDATE SKIP LOCKED)
RETURNING true`

// Worker queries. $now parameters are nullable: NULL means the database's
// now(), which production uses; tests pass a time to control leases and
// backoff without sleeping.

// claimReceipts: $1 now, $2 max_attempts, $3 lease in milliseconds, and
// the limit in the text ($LIMIT, claimSQL), not a parameter: the claim runs a
// generic plan (claimLocals), and PostgreSQL plans a LIMIT parameter as 10 %
// of the rows it estimates, which for a large backlog makes reading all of
// it and sorting (or a hash join over the whole table for the UPDATE) the
// cheaper-looking plan; a LIMIT it can read keeps the ordered index scan
// and the primary-key lookups whatever the backlog. One prepared statement
// per limit: the worker asks for CLAIM_LIMIT, or less what it carries.
// Takes up to limit claimable rows, skipping rows another transaction has locked,
// counts the attempt and hides the rows for the lease. It commits on its own
// (autocommit), so the attempt is counted even if the process then dies.
//
// Every claim, the last attempt's too, hides its rows until the lease's end,
// a finite time in the future: that is how the operator's retry
// (retryReceipts) tells a receipt a worker holds right now, and skips it.
// A row whose last attempt was claimed by a process that died waits at the
// lease's end in the range of webhook_inbox_unprocessed this query reads
// (available_at <= now, filtered out by attempts) until the worker's next
// run parks it out of that range (parkNeedsReview, at most a minute later).
// The returned available_at (the lease's end) is the claim's fencing token
// with attempts (releaseClaims).
var claimReceipts = `
WITH picked AS (
    SELECT provider, endpoint, event_id
      FROM webhook_inbox
     WHERE processed_at IS NULL
       AND available_at <= coalesce($1::timestamptz, now())
       AND attempts < $2
     ORDER BY available_at
     LIMIT $LIMIT
       FOR UPDATE SKIP LOCKED
)
UPDATE webhook_inbox AS w
   SET attempts     = w.attempts + 1,
       available_at = coalesce($1::timestamptz, now()) + $3::bigint * interval '1 millisecond'
  FROM picked
 WHERE (w.provider, w.endpoint, w.event_id) = (picked.provider, picked.endpoint, picked.event_id)
RETURNING w.provider, w.endpoint, w.event_id, w.event_type, w.attempts, coalesce(w.api_version, ''), w.source,
          w.available_at, ` + lockKey

// claimSQL is claimReceipts taking up to limit rows ($LIMIT).
func claimSQL(limit int) string {
	return strings.Replace(claimReceipts, "$LIMIT", strconv.Itoa(limit), 1)
}

// lockKey is the order a batch applies its receipts in (Claimed.LockKey):
// the invoice each event belongs to, so that every batch takes the rows of
// one invoice (invoices, payment_links, refunds, ledger_entries) together
// and invoices in one global order, and two batches cannot each hold one
// invoice's rows while waiting for the other's (a deadlock, which
// PostgreSQL breaks only after deadlock_timeout). The invoice is the
// event's object (an invoice), the object's invoice field (charges before
// 2025-03-31.basil, invoice payments), or what payment_links knows of its
// charge or PaymentIntent (refunds); failing that, its charge, then its own
// id. It reads payment_links (the handlers' table, internal/handlers) only
// to order the work.
//
// A field may be an id or, expanded, an object with one: idOf reads both.
var lockKey = `CASE WHEN w.object_id LIKE 'in\_%' THEN w.object_id
     ELSE coalesce(
         nullif(` + idOf("invoice") + `, ''),
         (SELECT min(l.invoice_id) FROM payment_links l
           WHERE l.payment_id IN (` + idOf("charge") + `, ` + idOf("payment_intent") + `, w.object_id)),
         nullif(` + idOf("charge") + `, ''),
         coalesce(w.object_id, '')) END`

// idOf is the id in data.object.<field>: the field itself when it is a
// string, its id when it is an expanded object, else NULL.
func idOf(field string) string {
	f := "w.payload #> '{data,object," + field + "}'"
	return "CASE jsonb_typeof(" + f + ") WHEN 'string' THEN " + f + " #>> '{}' WHEN 'object' THEN " + f + " ->> 'id' END"
}

// claimable: $1 now, $2 max_attempts. Whether a claim would find anything:
// the resident worker's poll while the inbox is empty. The same index range
// as claimReceipts (webhook_inbox_unprocessed), read only: no lock, no
// write, one index probe.
const claimable = `
SELECT EXISTS (
    SELECT 1 FROM webhook_inbox
     WHERE processed_at IS NULL
       AND available_at <= coalesce($1::timestamptz, now())
       AND attempts < $2)`

// setLocalStatementTimeout: $1 the timeout ('250ms'). For the current
// transaction only; sent in one pipeline with the statement it bounds (see
// queryWithin).
const setLocalStatementTimeout = `SELECT set_config('statement_timeout', $1, true)`

// setLocalTimeouts: $1 the statement timeout, $2 the lock timeout ('100ms').
// For the current transaction only (SetLocalTimeouts).
const setLocalTimeouts = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)`

// setClaimLocals: the current transaction commits without waiting for its
// WAL flush, and plans its prepared statements once (the claim's; see
// claimLocals in claim.go).
const setClaimLocals = `SELECT set_config('synchronous_commit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// lockReceipt and lockReceipts return the event as the handlers get it, as
// bytea: the exact bytes Stripe sent when jsonb could not hold them
// (payload_raw), else the jsonb payload's text.

// lockReceipt: $1 provider, $2 endpoint, $3 event_id. Waits for (not skips)
// a row lock, and returns nothing when the row is already processed.
const lockReceipt = `
SELECT event_type, coalesce(payload_raw, convert_to(payload::text, 'UTF8')), livemode, coalesce(account, '')
  FROM webhook_inbox
 WHERE provider = $1 AND endpoint = $2 AND event_id = $3
   AND processed_at IS NULL
   FOR UPDATE`

// markProcessed: $1 provider, $2 endpoint, $3 event_id, $4 outcome, $5 now.
// Returns the receipt-to-effect latency, processed_at - received_at, in
// seconds.
const markProcessed = `
UPDATE webhook_inbox
   SET processed_at = coalesce($5::timestamptz, now()),
       outcome      = $4,
       last_error   = NULL
 WHERE provider = $1 AND endpoint = $2 AND event_id = $3
   AND processed_at IS NULL
RETURNING extract(epoch FROM processed_at - received_at)::float8`

// recordFailure: $1 provider, $2 endpoint, $3 event_id, $4 error text,
// $5 now, $6 delay in milliseconds, $7 max_attempts. Never touches a row
// another worker has completed. The delay counts from the failure
// (clock_timestamp), not from the start of the transaction, which for a
// batch can be seconds earlier. A row that has used up its attempts waits
// for review out of the claim's way (available_at = 'infinity', as
// parkNeedsReview parks a last attempt whose lease ended without one).
const recordFailure = `
UPDATE webhook_inbox
   SET last_error   = $4,
       available_at = CASE WHEN attempts >= $7 THEN 'infinity'::timestamptz
                           ELSE coalesce($5::timestamptz, clock_timestamp()) + $6::bigint * interval '1 millisecond' END
 WHERE provider = $1 AND endpoint = $2 AND event_id = $3
   AND processed_at IS NULL`

// parkNeedsReview: $1 max_attempts, $2 now. Hides, as recordFailure does,
// unprocessed rows that used up their attempts but still have a finite
// available_at that has passed: rows whose last attempt's claim ended
// without an outcome (the process died), rows that reached the limit before
// these queries parked them, or whose limit MAX_ATTEMPTS lowered. A row
// whose lease has not ended is a worker's (it may still record the
// outcome), and rows another transaction holds are left for the next run.
const parkNeedsReview = `
UPDATE webhook_inbox AS w
   SET available_at = 'infinity'
  FROM (SELECT provider, endpoint, event_id
          FROM webhook_inbox
         WHERE processed_at IS NULL
           AND available_at <= coalesce($2::timestamptz, now())
           AND attempts >= $1
           FOR UPDATE SKIP LOCKED) AS p
 WHERE (w.provider, w.endpoint, w.event_id) = (p.provider, p.endpoint, p.event_id)`

// releaseClaims: $1 providers, $2 endpoints, $3 event_ids, $4 the attempts
// and $6 the lease's end (available_at) each claim returned, $5 now. Gives
// back claimed rows that were never attempted (the invocation is about to
// end): the attempt is uncounted and the row is claimable at once. The
// claim's attempts and lease end are its fencing token: a row that differs
// in either was claimed again by another worker (after the lease expired,
// or after an operator's retry reset its attempts: the retry skips rows
// whose lease has not ended, but a worker may outlive its lease), failed,
// or retried since; it is not ours to release. Two claims share the token
// only if they counted the same attempt and computed the same lease end to
// the microsecond. Returns the keys of the rows released.
const releaseClaims = `
UPDATE webhook_inbox AS w
   SET attempts     = greatest(w.attempts - 1, 0),
       available_at = coalesce($5::timestamptz, now())
  FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $6::timestamptz[]) AS k(provider, endpoint, event_id, attempts, lease_until)
 WHERE (w.provider, w.endpoint, w.event_id) = (k.provider, k.endpoint, k.event_id)
   AND w.attempts = k.attempts
   AND w.available_at = k.lease_until
   AND w.processed_at IS NULL
RETURNING w.provider, w.endpoint, w.event_id`

// backlogStats: $1 max_attempts, $2 now. Reads only unprocessed rows
// (through the partial index).
const backlogStats = `
SELECT count(*) FILTER (WHERE attempts < $1),
       coalesce(extract(epoch FROM coalesce($2::timestamptz, now()) - min(received_at) FILTER (WHERE attempts < $1)), 0)::float8,
       count(*) FILTER (WHERE attempts >= $1)
  FROM webhook_inbox
 WHERE processed_at IS NULL`

// lockReceipts: $1 providers, $2 endpoints, $3 event_ids. Locks the given
// receipts that are still unprocessed, waiting for concurrent holders, and
// returns their contents. Only this batch's claim holds them (a late worker
// past its lease aside), so the order they are locked in does not matter;
// the business rows are taken in lockOrder (internal/worker/apply.go).
const lockReceipts = `
SELECT w.provider, w.endpoint, w.event_id, w.event_type, coalesce(w.payload_raw, convert_to(w.payload::text, 'UTF8')), w.livemode, coalesce(w.account, '')
  FROM webhook_inbox AS w
  JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(provider, endpoint, event_id)
    ON (w.provider, w.endpoint, w.event_id) = (k.provider, k.endpoint, k.event_id)
 WHERE w.processed_at IS NULL
 ORDER BY coalesce(w.object_id, ''), w.event_id
   FOR UPDATE OF w`

// markManyProcessed: $1 providers, $2 endpoints, $3 event_ids (at least
// one), $4 outcomes, $5 now. Returns each marked receipt's
// receipt-to-effect latency in seconds. It fails unless it marked every
// receipt it was given: each must be locked unprocessed by the
// transaction (lockReceipts), and a mark that missed one must not commit,
// even sent ahead of COMMIT in one pipeline (MarkManyProcessedCommit). The
// failure is a cast of the explanation to boolean, the one way plain SQL
// has to raise an error: "invalid input syntax for type boolean: marked 1
// of 2 receipts ...". checked always has one row (an aggregate), so the
// check runs even when nothing was marked.
const markManyProcessed = `
WITH marked AS (
UPDATE webhook_inbox AS w
   SET processed_at = coalesce($5::timestamptz, now()),
       outcome      = k.outcome,
       last_error   = NULL
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(provider, endpoint, event_id, outcome)
 WHERE (w.provider, w.endpoint, w.event_id) = (k.provider, k.endpoint, k.event_id)
   AND w.processed_at IS NULL
RETURNING extract(epoch FROM w.processed_at - w.received_at)::float8 AS latency
), checked AS (
SELECT CASE WHEN count(*) = cardinality($3::text[]) THEN true
            ELSE ('marked ' || count(*) || ' of ' || cardinality($3::text[])
                  || ' receipts: the others were not locked unprocessed by this transaction')::boolean END AS ok
  FROM marked
)
SELECT m.latency FROM checked AS c LEFT JOIN marked AS m ON c.ok`

// Reconciler queries (internal/reconcile). reconcile_high_water is this
// package's table too: the reconciler's mark sits next to the receipts it
// vouches for.

// highWater: $1 provider, $2 endpoint. No row: the endpoint was never
// reconciled.
const highWater = `
SELECT high_water FROM reconcile_high_water WHERE provider = $1 AND endpoint = $2`

// advanceHighWater: $1 provider, $2 endpoint, $3 the new mark. Never moves a
// mark backwards (two reconcilers racing, or a backfill of an older window).
// Returns the mark now stored.
const advanceHighWater = `
INSERT INTO reconcile_high_water AS h (provider, endpoint, high_water)
VALUES ($1, $2, $3)
ON CONFLICT (provider, endpoint) DO UPDATE
   SET high_water = greatest(h.high_water, EXCLUDED.high_water),
       updated_at = now()
RETURNING high_water`

// The purge's statements (see purge.go, and internal/retention for how the
// batches are run). Each is one batch: a statement that commits on its own,
// picks at most $2 rows through a partial index of
// migrations/0004_retention_indexes.sql, skips rows another transaction has
// locked, and re-states outside the subquery the condition that makes a row
// eligible, so that even a stale ctid could never touch an unprocessed
// receipt. Rows are picked by ctid because the key has three text columns
// that an array cannot carry into an index lookup. A ctid names a row
// version; it is stable here because this statement holds the row's lock
// until it ends (nobody else can update, delete or move the row, and a
// locked row is never pruned). Why SKIP LOCKED and an array rather than IN:
// internal/retention/queries.go.

// deleteReceipts: $1 cutoff, $2 batch size. Deletes up to $2 processed
// receipts with processed_at strictly before the cutoff, oldest first
// (through the index webhook_inbox_processed). Unprocessed rows, including
// those that wait for review, are never candidates.
const deleteReceipts = `
DELETE FROM webhook_inbox
 WHERE ctid = ANY (ARRAY(
           SELECT ctid
             FROM webhook_inbox
            WHERE processed_at IS NOT NULL
              AND processed_at < $1::timestamptz
            ORDER BY processed_at
            LIMIT $2
              FOR UPDATE SKIP LOCKED))
   AND processed_at IS NOT NULL
   AND processed_at < $1::timestamptz`

// scrubbedPayload replaces a scrubbed receipt's payload. It must stay
// identical to the literal in scrubPayloads and in the predicate of the index
// webhook_inbox_unscrubbed (migrations/0004_retention_indexes.sql), and
// to the one the content guard admits (migrations/0014_listed_first.sql).
const scrubbedPayload = `{"scrubbed": true}`

// scrubPayloads: $1 scrub cutoff, $2 batch size. Replaces the payload of up
// to $2 processed receipts with processed_at strictly before the cutoff that
// are not scrubbed yet (so repeated batches terminate), oldest first through
// the index webhook_inbox_unscrubbed. The key columns stay, so a redelivery
// of the event is still a duplicate; the worker never reads the payload of a
// processed receipt. payload_raw (the exact bytes of an event jsonb could not
// hold, migrations/0007_receipt_payload_raw.sql) is the same content and is
// cleared with it.
const scrubPayloads = `
UPDATE webhook_inbox
   SET payload = '{"scrubbed": true}'::jsonb,
       payload_raw = NULL
 WHERE ctid = ANY (ARRAY(
           SELECT ctid
             FROM webhook_inbox
            WHERE processed_at IS NOT NULL
              AND payload <> '{"scrubbed": true}'::jsonb
              AND processed_at < $1::timestamptz
            ORDER BY processed_at
            LIMIT $2
              FOR UPDATE SKIP LOCKED))
   AND processed_at IS NOT NULL
   AND processed_at < $1::timestamptz`
