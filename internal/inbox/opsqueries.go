package inbox

// The operators' statements on webhook_inbox (ops.go). Each takes the
// filter's parameters first ($1-$8, receiptFilter). Every query runs as an
// unnamed statement (no statement cache, see internal/database), which
// PostgreSQL plans with the actual parameters: an unset filter (NULL) and
// the state's CASE fold away, and a state of the backlog or needs-review
// is read through the partial index of unprocessed receipts.

// receiptFilter: $1 endpoint, $2 event_type, $3 state (see States), $4 a
// case-insensitive substring of last_error, $5 received since (inclusive),
// $6 received until (exclusive), $7 max_attempts, $8 event_id. NULL matches
// everything.
const receiptFilter = `
       provider = 'stripe'
   AND ($1::text IS NULL OR endpoint = $1)
   AND ($2::text IS NULL OR event_type = $2)
   AND ($8::text IS NULL OR event_id = $8)
   AND ($4::text IS NULL OR strpos(lower(last_error), lower($4)) > 0)
   AND ($5::timestamptz IS NULL OR received_at >= $5)
   AND ($6::timestamptz IS NULL OR received_at < $6)
   AND CASE $3::text
         WHEN 'backlog'      THEN processed_at IS NULL AND attempts < $7
         WHEN 'failed'       THEN processed_at IS NULL AND attempts < $7 AND last_error IS NOT NULL
         WHEN 'needs-review' THEN processed_at IS NULL AND attempts >= $7
         WHEN 'processed'    THEN processed_at IS NOT NULL
         ELSE true
       END`

// receiptColumns: what an operator sees of a receipt (scanReceipt), the
// state computed as receiptFilter defines it ($7 max_attempts) and the
// payload only when payloadWanted is true.
func receiptColumns(maxAttempts, payloadWanted string) string {
	return `
endpoint, event_id, event_type,
CASE WHEN processed_at IS NOT NULL THEN 'processed'
     WHEN attempts >= ` + maxAttempts + ` THEN 'needs-review'
     WHEN last_error IS NOT NULL THEN 'failed'
     ELSE 'backlog' END,
coalesce(api_version, ''), livemode, coalesce(account, ''), coalesce(object_id, ''),
received_at, signed_at,
CASE WHEN processed_at IS NULL AND available_at < 'infinity' THEN available_at END,
attempts, coalesce(last_error, ''), processed_at, coalesce(outcome, ''),
coalesce(secret_fingerprint, ''), duplicates, source, listed_first,
CASE WHEN ` + payloadWanted + ` THEN coalesce(payload_raw, convert_to(payload::text, 'UTF8')) END`
}

// listReceipts: the filter's $1-$8, then $9 $10 $11 the page key (received_at,
// endpoint, event_id) to continue after (NULL: from the newest), $12 limit.
// Newest first.
var listReceipts = `
SELECT ` + receiptColumns("$7", "false") + `
  FROM webhook_inbox
 WHERE ` + receiptFilter + `
   AND ($9::timestamptz IS NULL OR (received_at, endpoint, event_id) < ($9, $10::text, $11::text))
 ORDER BY received_at DESC, endpoint DESC, event_id DESC
 LIMIT $12`

// receiptsByEventID: $1 event_id, $2 endpoint (NULL: every endpoint),
// $3 max_attempts, $4 whether to return the payload.
var receiptsByEventID = `
SELECT ` + receiptColumns("$3", "$4::bool") + `
  FROM webhook_inbox
 WHERE provider = 'stripe' AND event_id = $1 AND ($2::text IS NULL OR endpoint = $2)
 ORDER BY endpoint`

// heldNow: a receipt a worker holds right now, which the operator's retry
// skips: its available_at is finite and in the future. Every claim sets it
// to the lease's end (claimReceipts), so a receipt a worker has claimed and
// not yet finished or given back always matches. Were the retry to reset it,
// another worker could claim it again while the first one holds it, and
// the first one's give-back could meet a claim with its own attempt count.
// A failed receipt waiting out its backoff matches too (recordFailure sets
// the backoff's end, at most the worker's BACKOFF_CAP away): the two look
// alike here, and it is due again by then anyway.
const heldNow = `available_at > now() AND available_at < 'infinity'`

// retryReceipts: the filter's $1-$8. One statement: the matching
// unprocessed receipts no worker holds (heldNow) get a fresh count and are
// claimable now (a receipt waiting for review at available_at = 'infinity'
// comes back into the claim's range). A receipt whose row a worker has
// locked is waited for; READ COMMITTED re-checks the WHERE on the version
// the worker committed, so one it processed (processed_at) or claimed
// meanwhile (heldNow) is left alone. last_error stays as the history of the
// last failure.
var retryReceipts = `
UPDATE webhook_inbox
   SET attempts = 0, available_at = now()
 WHERE processed_at IS NULL AND NOT (` + heldNow + `) AND ` + receiptFilter + `
RETURNING endpoint, event_id`

// retryCandidates: what retryReceipts would change, changing nothing.
var retryCandidates = `
SELECT endpoint, event_id
  FROM webhook_inbox
 WHERE processed_at IS NULL AND NOT (` + heldNow + `) AND ` + receiptFilter + `
 ORDER BY received_at, endpoint, event_id`

// retrySkipped: the filter's $1-$8. The matching unprocessed receipts the
// retry skips (heldNow), with the time their lease or backoff ends. Run
// after retryReceipts in its transaction, it also lists a receipt a worker
// claimed between the two statements.
var retrySkipped = `
SELECT endpoint, event_id, available_at
  FROM webhook_inbox
 WHERE processed_at IS NULL AND ` + heldNow + ` AND ` + receiptFilter + `
 ORDER BY received_at, endpoint, event_id`

// The window queries below take $1, the start of the window, and read the
// receipts received since then. received_at has no index (it would cost
// every webhook insert); a receipt received in the window is either
// unprocessed or was processed after it arrived, so the second condition
// changes nothing in the result but lets PostgreSQL read the window through
// the two partial indexes (unprocessed; processed by processed_at) instead
// of the whole table.
const inWindow = `received_at >= $1 AND (processed_at IS NULL OR processed_at >= $1)`

// typesSince: receipts and their duplicate deliveries per type.
const typesSince = `
SELECT event_type, count(*)::int, coalesce(sum(duplicates), 0)::int
  FROM webhook_inbox
 WHERE ` + inWindow + `
 GROUP BY event_type
 ORDER BY 2 DESC, 1`

// sourcesSince: receipts per source (webhook, eventbridge, reconcile).
const sourcesSince = `
SELECT source, count(*)::int
  FROM webhook_inbox
 WHERE ` + inWindow + `
 GROUP BY source
 ORDER BY 2 DESC, 1`

// latencySince: $1 the start of the window. Receipt-to-effect of the
// receipts processed since then (through webhook_inbox_processed).
const latencySince = `
SELECT count(*)::int,
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY l), 0)::float8,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY l), 0)::float8,
       coalesce(max(l), 0)::float8
  FROM (SELECT extract(epoch FROM processed_at - received_at) AS l
          FROM webhook_inbox WHERE processed_at >= $1) AS x`

// versionsSince: receipts per endpoint and API version.
const versionsSince = `
SELECT endpoint, coalesce(api_version, ''), count(*)::int, max(received_at)
  FROM webhook_inbox
 WHERE ` + inWindow + `
 GROUP BY 1, 2
 ORDER BY 1, 2`

// secretsSince: receipts per endpoint and the fingerprint of the secret
// that verified them.
const secretsSince = `
SELECT endpoint, coalesce(secret_fingerprint, ''), count(*)::int, min(received_at), max(received_at)
  FROM webhook_inbox
 WHERE ` + inWindow + `
 GROUP BY 1, 2
 ORDER BY 1, 5 DESC`
