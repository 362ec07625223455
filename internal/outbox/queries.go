package outbox

// The outbox table's SQL (its schema: migrations 0002 and 0013): the
// handlers' INSERT (InsertRowsSQL, which they compose into their own
// statements), the relay's claims and marks, the operators' reads and
// retries, and the purge's delete of published rows. $now is the caller's
// clock when set (tests move time), the database's now() otherwise.

// InsertRowsSQL queues outbox rows: the INSERT without its rows, which the
// caller completes with a SELECT of (aggregate_type, aggregate_id,
// event_type, payload) and runs in the transaction of the business effect,
// so that the row commits with it or not at all. internal/handlers
// composes it into invoice.paid's one statement, as a CTE (payInvoice).
const InsertRowsSQL = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)`

// claimRows: $1 now, $2 max attempts, $3 limit, $4 lease (seconds), $5 the
// claim's token. Takes up to $3 due rows (oldest first; rows another relay
// holds locked are skipped, not waited for), counts the attempt, hides them
// until the lease's end and stamps them with the token. One autocommit
// statement: the claim is durable before anything is published, so a relay
// that dies afterwards has used the attempt, and the row is due again when
// the lease ends.
const claimRows = `
WITH due AS (
    SELECT id FROM outbox
     WHERE published_at IS NULL
       AND available_at <= coalesce($1::timestamptz, now())
       AND attempts < $2
     ORDER BY available_at, id
     LIMIT $3
       FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
   SET attempts     = o.attempts + 1,
       leased_until = coalesce($1::timestamptz, now()) + make_interval(secs => $4),
       available_at = coalesce($1::timestamptz, now()) + make_interval(secs => $4),
       claim_token  = $5::uuid
  FROM due
 WHERE o.id = due.id
RETURNING o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload::text, o.created_at, o.attempts`

// markPublished: $1 ids, $2 the claim's token, $3 now. Marks the rows that
// still carry the token; a row another relay claimed since (its lease had
// expired) carries that relay's token and is left to it. Returns the ids
// marked.
const markPublished = `
UPDATE outbox
   SET published_at = coalesce($3::timestamptz, now()),
       leased_until = NULL, claim_token = NULL, last_error = NULL
 WHERE id = ANY($1::bigint[]) AND claim_token = $2::uuid AND published_at IS NULL
RETURNING id`

// recordFailures: $1 ids, $2 delays (seconds, one per id), $3 errors (one
// per id), $4 the claim's token, $5 now, $6 max attempts. The attempt
// counts: the row is due again after its delay, or, when it has used up its
// attempts, never again by itself (available_at 'infinity', outside the
// claim's range) until an operator retries it.
const recordFailures = `
UPDATE outbox o
   SET available_at = CASE WHEN o.attempts >= $6 THEN 'infinity'::timestamptz
                           ELSE coalesce($5::timestamptz, now()) + make_interval(secs => f.delay) END,
       leased_until = NULL, claim_token = NULL, last_error = f.error
  FROM unnest($1::bigint[], $2::float8[], $3::text[]) AS f(id, delay, error)
 WHERE o.id = f.id AND o.claim_token = $4::uuid AND o.published_at IS NULL`

// releaseRows: $1 ids, $2 delay (seconds), $3 error (NULL keeps the last
// one), $4 the claim's token, $5 now. Gives claimed rows back with their
// attempt uncounted: EventBridge throttled them, the call failed as a whole
// (a 5xx, the network, the bus unreachable: nothing about the rows), or the
// run ran out of time before sending them.
const releaseRows = `
UPDATE outbox
   SET attempts     = greatest(attempts - 1, 0),
       available_at = coalesce($5::timestamptz, now()) + make_interval(secs => $2),
       leased_until = NULL, claim_token = NULL, last_error = coalesce($3, last_error)
 WHERE id = ANY($1::bigint[]) AND claim_token = $4::uuid AND published_at IS NULL`

// parkExhausted: $1 max attempts, $2 now. Rows that used up their attempts without
// a recorded failure (the relay died during their last attempt, so nothing
// set 'infinity') would sit in the claim's index range, skipped by every
// claim; this parks them with the others waiting for a human. Only rows
// whose lease has ended: a relay may still be publishing one.
const parkExhausted = `
UPDATE outbox
   SET available_at = 'infinity', leased_until = NULL, claim_token = NULL,
       last_error = coalesce(last_error, 'attempts used up (the relay stopped during the last one)')
 WHERE published_at IS NULL AND attempts >= $1 AND available_at <> 'infinity'
   AND available_at <= coalesce($2::timestamptz, now())`

// backlog: $1 max attempts, $2 now. Unpublished rows still being tried,
// the age of the oldest of them, and rows waiting for a human.
const backlog = `
SELECT count(*) FILTER (WHERE attempts < $1),
       coalesce(extract(epoch FROM coalesce($2::timestamptz, now()) - min(created_at) FILTER (WHERE attempts < $1)), 0)::float8,
       count(*) FILTER (WHERE attempts >= $1)
  FROM outbox
 WHERE published_at IS NULL`

// retryWaiting: $1 max attempts, $2 ids (NULL: all of them). Gives rows
// waiting for a human a fresh count of attempts, due now, and returns their
// ids. Never a published row, nor one a relay holds (its lease has not
// ended: the relay died, or is still trying, during the last attempt).
// Sets attempts, available_at, leased_until and claim_token only: the
// columns inbox_ops may update (internal/approle opsGrants).
const retryWaiting = `
UPDATE outbox
   SET attempts = 0, available_at = now(), leased_until = NULL, claim_token = NULL
 WHERE published_at IS NULL AND attempts >= $1
   AND (leased_until IS NULL OR leased_until <= now())
   AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))
RETURNING id`

// retryCandidates: retryWaiting's rows, changed by nothing (a dry run).
const retryCandidates = `
SELECT id FROM outbox
 WHERE published_at IS NULL AND attempts >= $1
   AND (leased_until IS NULL OR leased_until <= now())
   AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))`

// rowStates: $1 ids. What an operator's ids name: published or not, the
// attempts, the lease.
const rowStates = `
SELECT id, published_at, attempts, leased_until FROM outbox WHERE id = ANY($1::bigint[])`

// listRows: $1 max attempts, $2 all unpublished (false: only the rows
// waiting for a human), $3 and $4 the page's start (created_at, id of the
// previous page's last row; NULL: the first page), $5 limit. Newest first.
const listRows = `
SELECT id, aggregate_type, aggregate_id, event_type, attempts, coalesce(last_error, ''), created_at,
       nullif(available_at, 'infinity'), leased_until
  FROM outbox
 WHERE published_at IS NULL AND ($2 OR attempts >= $1)
   AND ($3::timestamptz IS NULL OR (created_at, id) < ($3::timestamptz, $4::bigint))
 ORDER BY created_at DESC, id DESC
 LIMIT $5`

// queuedBy: $1 event_id (the handlers put it in each payload). The rows a
// receipt queued, for the operators' show.
const queuedBy = `
SELECT id, aggregate_type, aggregate_id, event_type, payload, created_at, published_at
  FROM outbox WHERE payload->>'event_id' = $1 ORDER BY id`

// deletePublished: $1 cutoff, $2 batch size. Deletes up to $2 published
// outbox rows with published_at strictly before the cutoff, oldest first
// (through the index outbox_published). Unpublished rows are never
// candidates. One batch of the purge, which follows the rules of every
// purge batch (internal/retention/queries.go).
const deletePublished = `
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
