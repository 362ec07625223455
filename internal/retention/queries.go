package retention

// The purge's own statement: the cutoffs. Its batches are statements of
// the tables they delete from, so they live with each table's other SQL:
// the receipts' (delete and scrub) in internal/inbox (queries.go,
// purge.go), the published outbox rows' in internal/outbox (queries.go,
// purge.go). Every batch follows the rules below. Parameters are
// positional; each query documents them.
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
// stall the batch while it already holds locks on the rows it did get, and
// everything that touches those rows would queue behind it. With SKIP LOCKED
// two purges split the work instead of queueing, and a batch never waits on
// a row lock at all. The price: a batch can come back
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
// webhook_inbox rows are picked by ctid (see internal/inbox/queries.go for
// why that is safe). Every statement also re-states, outside the subquery,
// the condition that makes a row deletable, so that even a stale ctid or id
// could never delete an unprocessed receipt or an unpublished outbox row.

// purgeCutoffs: $1 now (NULL: the database's now()), $2 retention in
// milliseconds, $3 scrub-after in milliseconds (0 when scrubbing is off; the
// second column is then unused). The cutoffs are computed once per run, so
// every batch of a run deletes against the same boundary.
const purgeCutoffs = `
SELECT coalesce($1::timestamptz, now()) - $2::bigint * interval '1 millisecond',
       coalesce($1::timestamptz, now()) - $3::bigint * interval '1 millisecond'`
