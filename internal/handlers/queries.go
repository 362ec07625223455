package handlers

// The SQL of the business tables (invoices, ledger_entries, outbox,
// anomalies). Invoice status transitions follow Stripe's lifecycle:
//
//	draft -> open -> paid
//	           |  -> void
//	           |  -> uncollectible -> paid | void
//
// paid and void are final. Every statement is an upsert that admits only
// forward transitions, so a late or repeated event changes no status (it
// may still update the descriptive fields, when its snapshot is newer).

// upsertInvoice: $1 id, $2 customer, $3 target status, $4 currency,
// $5 amount_due, $6 amount_paid, $7 statuses the target may replace,
// $8 the event's created (seconds), $9 the target's status rank,
// $10 event id. Inserts the invoice in the target state when absent (events
// may arrive before invoice.created); otherwise moves it only from an allowed
// state.
//
// Two things change an existing row, independently: the status moves only
// forward (never by created, which Stripe records in seconds and does not
// order by), and the descriptive fields (customer_id, currency, amount_due)
// follow the newest snapshot: the one with the greatest (created, status
// rank, event id). The event id only breaks exact ties, so that the same set
// of events leaves the same values whatever order they are processed in. The
// row is returned when either happened.
const upsertInvoice = `
INSERT INTO invoices AS i (id, customer_id, status, currency, amount_due, amount_paid, paid_at,
                           snapshot_created, snapshot_rank, snapshot_event_id)
VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $3 = 'paid' THEN now() END, $8, $9, $10)
ON CONFLICT (id) DO UPDATE
   SET status            = CASE WHEN i.status = ANY ($7::text[]) THEN EXCLUDED.status ELSE i.status END,
       amount_paid       = CASE WHEN i.status = ANY ($7::text[]) AND EXCLUDED.status = 'paid' THEN EXCLUDED.amount_paid ELSE i.amount_paid END,
       paid_at           = CASE WHEN i.status = ANY ($7::text[]) AND EXCLUDED.status = 'paid' THEN coalesce(i.paid_at, now()) ELSE i.paid_at END,
       customer_id       = CASE WHEN ` + newerSnapshot + ` THEN coalesce(nullif(EXCLUDED.customer_id, ''), i.customer_id) ELSE i.customer_id END,
       currency          = CASE WHEN ` + newerSnapshot + ` THEN coalesce(EXCLUDED.currency, i.currency) ELSE coalesce(i.currency, EXCLUDED.currency) END,
       amount_due        = CASE WHEN ` + newerSnapshot + ` THEN EXCLUDED.amount_due ELSE i.amount_due END,
       snapshot_created  = CASE WHEN ` + newerSnapshot + ` THEN EXCLUDED.snapshot_created ELSE i.snapshot_created END,
       snapshot_rank     = CASE WHEN ` + newerSnapshot + ` THEN EXCLUDED.snapshot_rank ELSE i.snapshot_rank END,
       snapshot_event_id = CASE WHEN ` + newerSnapshot + ` THEN EXCLUDED.snapshot_event_id ELSE i.snapshot_event_id END,
       updated_at        = now()
 WHERE i.status = ANY ($7::text[]) OR ` + newerSnapshot

const newerSnapshot = `(EXCLUDED.snapshot_created, EXCLUDED.snapshot_rank, EXCLUDED.snapshot_event_id) > (i.snapshot_created, i.snapshot_rank, i.snapshot_event_id)`

// payInvoice: the parameters of upsertInvoice with target 'paid', then
// $11 outbox event_type, $12 outbox payload, $13 the payments (ch_/pi_ ids)
// the invoice names. In one statement: moves the invoice to paid (or creates
// it paid), books the payment, queues the notification and records the
// payment links (see linkPayments). It returns the invoice's status after
// this statement when the statement changed the row (NULL otherwise), the
// status as this statement's snapshot saw it (NULL if absent), and whether
// refunds may be booked under a payment it has just linked (then the caller
// runs moveRefundEntries).
//
// The payment is booked when the row it returns is paid: either it moved it
// to paid, or the invoice was already paid and only its descriptive fields
// changed, when the booking is already there (ON CONFLICT DO NOTHING). When
// the statement did not change the row, ON CONFLICT DO UPDATE has still
// locked the row and checked the latest version: its status is paid or void.
// Both are final, so a snapshot status of paid or void is the latest one.
// Any other snapshot status means the row changed after the snapshot was
// taken; the caller then reads it with invoiceStatus in a new statement.
const payInvoice = `
WITH paid AS (` + upsertInvoice + `
RETURNING i.id, i.status
), booked AS (
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
SELECT id, 'payment', $6::bigint, $4::text, $10::text FROM paid WHERE status = 'paid'
ON CONFLICT DO NOTHING
RETURNING id
), queued AS (
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'Invoice', $1, $11, $12::jsonb FROM booked
), linked AS (` + linkPaymentsCTE + `
)
SELECT (SELECT status FROM paid), (SELECT status FROM invoices WHERE id = $1),
       coalesce((SELECT bool_or(has_refunds) FROM linked), false)`

// linkPaymentsCTE: $1 invoice id, $13 payment ids (sorted, so that
// concurrent statements lock them in one order). Records that the payments
// paid the invoice. A link, once known, is kept (a payment pays one invoice).
// A row without invoice_id was left by a refund seen before the link
// (applyRefund); this is when its entries must move to the invoice.
const linkPaymentsCTE = `
INSERT INTO payment_links AS l (payment_id, invoice_id)
SELECT p, $1::text FROM unnest($13::text[]) AS p ORDER BY p
ON CONFLICT (payment_id) DO UPDATE
   SET invoice_id = EXCLUDED.invoice_id, updated_at = now()
 WHERE l.invoice_id IS NULL
RETURNING l.has_refunds`

// linkPayments: $1 invoice id, $2 payment ids (sorted). See linkPaymentsCTE.
// Returns whether refunds may be booked under a payment it has just linked.
const linkPayments = `
WITH linked AS (
INSERT INTO payment_links AS l (payment_id, invoice_id)
SELECT p, $1::text FROM unnest($2::text[]) AS p ORDER BY p
ON CONFLICT (payment_id) DO UPDATE
   SET invoice_id = EXCLUDED.invoice_id, updated_at = now()
 WHERE l.invoice_id IS NULL
RETURNING l.has_refunds
)
SELECT coalesce(bool_or(has_refunds), false) FROM linked`

// moveRefundEntries: $1 invoice id, $2 payment ids. Moves the entries of
// refunds of those payments that were booked before the link was known
// (under the charge id) to the invoice, so that one refund always ends
// attributed to its invoice, whatever order the events came in. Only the
// attribution changes; amounts are never updated.
const moveRefundEntries = `
UPDATE ledger_entries AS e
   SET invoice_id = $1
  FROM refunds AS r
 WHERE (r.charge_id = ANY ($2::text[]) OR r.payment_intent_id = ANY ($2::text[]))
   AND e.kind IN ('refund:' || r.id, 'refund_reversal:' || r.id)
   AND e.invoice_id <> $1`

// applyRefund: $1 refund id, $2 charge id, $3 payment intent id (NULL when
// unknown), $4 amount (positive), $5 currency, $6 status, $7 event id,
// $8 the payment ids among $2 and $3 (sorted), $9 the key to book under
// while no payment is linked to an invoice.
//
// In one statement: takes the payment link rows first (every statement that
// touches both takes the links before the refund, so they cannot deadlock),
// merges this observation into the refund's row, and books the entries that
// row calls for, each once:
//
//	'refund:<id>'          -amount   if some event showed it succeeded
//	'refund_reversal:<id>' +amount   if so, and its highest status is failed or canceled
//
// The row is a merge that does not depend on order (highest-ranked status,
// ties by name; succeeded = any observation succeeded), and the entries are
// a function of it, so any order of the same events ends with the same
// entries (invoice_id, kind, amount, currency). A refund that went
// succeeded -> failed is booked and reversed even when the failure is
// processed first; one that went pending -> failed books nothing.
const applyRefund = `
WITH linked AS (
INSERT INTO payment_links AS l (payment_id, has_refunds)
SELECT p, true FROM unnest($8::text[]) AS p ORDER BY p
ON CONFLICT (payment_id) DO UPDATE SET has_refunds = true
RETURNING l.invoice_id
), merged AS (
INSERT INTO refunds AS r (id, charge_id, payment_intent_id, amount, currency, status, succeeded)
SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text, $6::text, $6::text = 'succeeded'
  FROM (SELECT count(*) FROM linked) AS links_first
ON CONFLICT (id) DO UPDATE
   -- The rank: pending, requires_action 0 < succeeded 1 < failed, canceled 2.
   SET status            = CASE WHEN (CASE EXCLUDED.status WHEN 'succeeded' THEN 1 WHEN 'failed' THEN 2 WHEN 'canceled' THEN 2 ELSE 0 END, EXCLUDED.status)
                                   > (CASE r.status WHEN 'succeeded' THEN 1 WHEN 'failed' THEN 2 WHEN 'canceled' THEN 2 ELSE 0 END, r.status)
                                THEN EXCLUDED.status ELSE r.status END,
       succeeded         = r.succeeded OR EXCLUDED.succeeded,
       charge_id         = coalesce(r.charge_id, EXCLUDED.charge_id),
       payment_intent_id = coalesce(r.payment_intent_id, EXCLUDED.payment_intent_id),
       currency          = coalesce(r.currency, EXCLUDED.currency),
       updated_at        = now()
RETURNING r.id, r.amount, r.currency, r.status, r.succeeded
), subject AS (
SELECT coalesce((SELECT min(invoice_id) FROM linked), $9::text) AS invoice_id
)
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
SELECT s.invoice_id, 'refund:' || m.id, -m.amount, m.currency, $7::text FROM merged m, subject s WHERE m.succeeded
UNION ALL
SELECT s.invoice_id, 'refund_reversal:' || m.id, m.amount, m.currency, $7::text FROM merged m, subject s
 WHERE m.succeeded AND m.status IN ('failed', 'canceled')
ON CONFLICT DO NOTHING`

// invoiceStatus: $1 id. Locks the row so the decision that follows (book or
// raise an anomaly) cannot race a concurrent transition.
const invoiceStatus = `SELECT status FROM invoices WHERE id = $1 FOR UPDATE`

// raiseAnomaly: $1 kind, $2 subject_id, $3 endpoint, $4 event_id, $5 detail.
const raiseAnomaly = `
INSERT INTO anomalies (kind, subject_id, endpoint, event_id, detail)
VALUES ($1, $2, $3, $4, $5::jsonb)
ON CONFLICT (kind, subject_id) DO NOTHING`

// countUnresolvedAnomalies: no parameters.
const countUnresolvedAnomalies = `SELECT count(*) FROM anomalies WHERE resolved_at IS NULL`
