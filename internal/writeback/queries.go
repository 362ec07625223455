package writeback

// The writeback_intents table's SQL (its schema: migration 0021), but the
// handlers' INSERT (internal/handlers payInvoice). $now is the caller's
// clock when set (tests move time), the database's now() otherwise.

// sentKey is the Idempotency-Key the sender sends for an intent: its key,
// and after an operator's retry of a refusal, ':retry<generation>'.
const sentKey = `idempotency_key || CASE WHEN key_generation > 0 THEN ':retry' || key_generation ELSE '' END`
const sentKeyW = `w.idempotency_key || CASE WHEN w.key_generation > 0 THEN ':retry' || w.key_generation ELSE '' END`

// claimIntents: $1 now, $2 limit, $3 lease (seconds), $4 the claim's token,
// $5 the key lifetime (seconds). Takes up to $2 due pending intents (others
// held locked are skipped), counts the attempt, stamps the first attempt,
// hides them until the lease's end and stamps them with the token. One
// autocommit statement: the claim (and its attempt) is durable before any
// call, so a sender that dies during the call has used the attempt and the
// intent's first attempt is known. Returns whether the first attempt was
// made longer ago than the key lifetime (read back first), and whether a
// newer intent of the same kind and target exists that is still to be sent
// (pending, claimed in this batch or not) or was sent (done, not itself
// superseded): either way sending this one would put the older value back
// after, or over, the newer one (superseded). A parked newer intent does not
// supersede: it may never be sent. The sender applies a batch in id order.
const claimIntents = `
WITH due AS (
    SELECT id, first_attempt_at AS prev_first FROM writeback_intents
     WHERE status = 'pending'
       AND available_at <= coalesce($1::timestamptz, now())
     ORDER BY available_at, id
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
UPDATE writeback_intents w
   SET attempts         = w.attempts + 1,
       first_attempt_at = coalesce(w.first_attempt_at, coalesce($1::timestamptz, now())),
       last_attempt_at  = coalesce($1::timestamptz, now()),
       leased_until     = coalesce($1::timestamptz, now()) + make_interval(secs => $3),
       available_at     = coalesce($1::timestamptz, now()) + make_interval(secs => $3),
       claim_token      = $4::uuid
  FROM due
 WHERE w.id = due.id
RETURNING w.id, w.kind, w.target, w.params::text, ` + sentKeyW + `, w.attempts,
          coalesce(due.prev_first < coalesce($1::timestamptz, now()) - make_interval(secs => $5), false),
          EXISTS (SELECT 1 FROM writeback_intents n
                   WHERE n.kind = w.kind AND n.target = w.target AND n.id > w.id
                     AND (n.status = 'pending' OR (n.status = 'done' AND n.result_via <> 'superseded')))`

// recordDone: $1 id, $2 token, $3 now, $4 result id, $5 result (jsonb),
// $6 via. Records the result while the intent carries the claim's token:
// from then on it is never claimed again.
const recordDone = `
UPDATE writeback_intents
   SET status = 'done', done_at = coalesce($3::timestamptz, now()),
       result_id = $4, result = $5::jsonb, result_via = $6,
       leased_until = NULL, claim_token = NULL, last_error = NULL
 WHERE id = $1 AND claim_token = $2::uuid AND status = 'pending'`

// recordRetry: $1 id, $2 token, $3 now, $4 delay (seconds), $5 error,
// $6 max attempts, $7 whether the attempt counts (false: a 429 or a refused
// key gives it back). Due again after the delay; parked when it has used
// up its attempts.
const recordRetry = `
UPDATE writeback_intents
   SET attempts     = CASE WHEN $7 THEN attempts ELSE greatest(attempts - 1, 0) END,
       status       = CASE WHEN $7 AND attempts >= $6 THEN 'parked' ELSE 'pending' END,
       available_at = coalesce($3::timestamptz, now()) + make_interval(secs => $4),
       leased_until = NULL, claim_token = NULL, last_error = $5
 WHERE id = $1 AND claim_token = $2::uuid AND status = 'pending'`

// recordParked: $1 id, $2 token, $3 error, $4 refused (false: an earlier
// request with the key ran, Stripe answered idempotency_error). Retrying
// cannot fix it: it waits for a human.
const recordParked = `
UPDATE writeback_intents
   SET status = 'parked', refused = $4::boolean, leased_until = NULL, claim_token = NULL, last_error = $3
 WHERE id = $1 AND claim_token = $2::uuid AND status = 'pending'`

// backlog: $1 now. Pending intents, the age of the oldest (since it was
// recorded), and parked intents. Read every minute: each part is its own
// subquery with the status of one partial index (writeback_intents_pending,
// writeback_intents_parked), so it reads the backlog, not the done intents
// that make up almost all of the table (TestBacklogUsesThePartialIndexes).
const backlog = `
SELECT (SELECT count(*) FROM writeback_intents WHERE status = 'pending'),
       coalesce(extract(epoch FROM coalesce($1::timestamptz, now())
                - (SELECT min(created_at) FROM writeback_intents WHERE status = 'pending')), 0)::float8,
       (SELECT count(*) FROM writeback_intents WHERE status = 'parked')`

// retryParked: $1 id. Gives a parked intent a fresh count of attempts, due
// now. Its first attempt stays: after the key lifetime the sender reads
// back before calling. An intent Stripe refused (a 4xx: nothing changed,
// and Stripe would replay the refusal saved under the key) gets the next
// key generation; one parked after ambiguous failures keeps its key (the
// call may have run). Sets the columns inbox_ops may update.
const retryParked = `
UPDATE writeback_intents
   SET status = 'pending', attempts = 0, available_at = now(), leased_until = NULL, claim_token = NULL,
       key_generation = key_generation + CASE WHEN refused THEN 1 ELSE 0 END, refused = false
 WHERE id = $1 AND status = 'parked'
RETURNING id`

// listParked: $1 limit. Intents waiting for a human, oldest first.
const listParked = `
SELECT id, kind, target, idempotency_key, event_id, status, attempts, coalesce(last_error, ''), created_at,
       first_attempt_at, last_attempt_at
  FROM writeback_intents
 WHERE status = 'parked'
 ORDER BY created_at, id
 LIMIT $1`

// showIntent: $1 id.
const showIntent = `
SELECT id, kind, target, idempotency_key, event_id, status, attempts, coalesce(last_error, ''), created_at,
       first_attempt_at, last_attempt_at, params::text, coalesce(result_id, ''), coalesce(result::text, ''),
       coalesce(result_via, ''), done_at, available_at, leased_until, key_generation, refused,
       ` + sentKey + `
  FROM writeback_intents WHERE id = $1`

// purgeDone: $1 cutoff, $2 limit. Deletes up to $2 done intents
// (superseded ones included) recorded done strictly before $1: the purge's
// batch (internal/retention), with the receipts' retention as the cutoff.
// A done intent is never read again by the sender, and deleting it cannot
// let a second intent be recorded for the same payment: the handler
// records an intent only in the statement that books the payment's ledger
// entry, and the ledger entry (never purged) is what stops a redelivery
// from booking, so from recording, again. Pending and parked intents are
// never deleted. No index on done_at: the batch reads the table, which the
// purge keeps to the retention's worth of intents; no row lock is taken
// first, since nothing updates a done intent, and the DELETE re-states the
// condition.
const purgeDone = `
DELETE FROM writeback_intents
 WHERE id = ANY (ARRAY(SELECT id FROM writeback_intents
                        WHERE status = 'done' AND done_at < $1
                        ORDER BY id
                        LIMIT $2))
   AND status = 'done' AND done_at < $1`
