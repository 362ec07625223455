package retention

// Every statement the purge runs. Parameters are positional because pgx's
// exec mode (no prepared-statement cache, see internal/database) sends them
// as-is; each query documents its parameters.
//
// Each batch is one statement that commits on its own (autocommit): it locks
// at most $2 rows, for as long as the statement runs, and never holds a
// transaction open across batches. The candidate rows are picked in the
// order of the partial indexes of migrations/0004_retention_indexes.sql, so a
// batch reads about $2 index entries whatever the table's size.
//
// Why FOR UPDATE SKIP LOCKED: the purge is the least urgent writer of these
// tables, and a row it skips is still past the cutoff at the next run, so
// skipping never deletes anything early, it only defers. Waiting instead
// would let one locked row (an operator's SELECT ... FOR UPDATE, a second
// purge started by a duplicate EventBridge delivery or a manual invoke)
// stall the batch while it already holds locks on the
// rows it did get, and everything that touches those rows would queue behind
// it. With SKIP LOCKED two purges split the work instead of queueing, and a
// batch never waits on a row lock at all. The price: a batch can come back
// short because rows were skipped, and the loop then stops for this run.
//
// The batch is picked as an array (= ANY (ARRAY(subquery))) rather than with
// IN (subquery): the subquery then runs once, as an InitPlan, and locks its
// rows before the first one is changed, and the outer statement is a direct
// lookup of those rows (a Tid Scan by ctid for webhook_inbox, the primary key
// for outbox) whatever the planner thinks of the table's size. With IN, the
// planner may choose a hash semi join that reads the whole table for every
// batch (it did for outbox at 200k rows).
//
// webhook_inbox rows are picked by ctid, because its key has three text
// columns that an array cannot carry into an index lookup. A ctid names a row
// version; it is stable here because the row is locked by this statement
// until it ends (nobody else can update, delete or move it, and a locked row
// is never pruned). Every statement also re-states, outside the subquery, the
// condition that makes a row deletable, so that even a stale ctid could never
// delete an unprocessed receipt or an unpublished outbox row.

// purgeCutoffs: $1 now (NULL: the database's now()), $2 retention in
// milliseconds, $3 scrub-after in milliseconds (0 when scrubbing is off; the
// second column is then unused). The cutoffs are computed once per run, so
// every batch of a run deletes against the same boundary.
const purgeCutoffs = `
SELECT coalesce($1::timestamptz, now()) - $2::bigint * interval '1 millisecond',
       coalesce($1::timestamptz, now()) - $3::bigint * interval '1 millisecond'`

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

// deleteOutbox: $1 cutoff, $2 batch size. Deletes up to $2 published outbox
// rows with published_at strictly before the cutoff, oldest first (through
// the index outbox_published). Unpublished rows are never candidates.
const deleteOutbox = `
DELETE FROM outbox
 WHERE id = ANY (ARRAY(
           SELECT id
             FROM outbox
            WHERE published_at IS NOT NULL
              AND published_at < $1::timestamptz
            ORDER BY published_at
            LIMIT $2
              FOR UPDATE SKIP LOCKED))
   AND published_at IS NOT NULL
   AND published_at < $1::timestamptz`

// scrubbedPayload replaces a scrubbed receipt's payload. It must stay
// identical to the literal in scrubPayloads and in the predicate of the index
// webhook_inbox_unscrubbed (migrations/0004_retention_indexes.sql).
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
