package handlers

// The SQL of the business tables (invoices, ledger_entries, outbox,
// anomalies). Invoice status transitions follow Stripe's lifecycle:
//
//	draft -> open -> paid
//	           |  -> void
//	           |  -> uncollectible -> paid | void
//
// paid and void are final. Every statement is an upsert whose WHERE clause
// admits only forward transitions, so a late or repeated event is a no-op.

// upsertInvoice: $1 id, $2 customer, $3 target status, $4 currency,
// $5 amount_due, $6 amount_paid, $7 statuses the target may replace.
// Inserts the invoice in the target state when absent (events may arrive
// before invoice.created); otherwise moves it only from an allowed state.
const upsertInvoice = `
INSERT INTO invoices AS i (id, customer_id, status, currency, amount_due, amount_paid, paid_at)
VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $3 = 'paid' THEN now() END)
ON CONFLICT (id) DO UPDATE
   SET status      = EXCLUDED.status,
       amount_paid = CASE WHEN EXCLUDED.status = 'paid' THEN EXCLUDED.amount_paid ELSE i.amount_paid END,
       paid_at     = CASE WHEN EXCLUDED.status = 'paid' THEN coalesce(i.paid_at, now()) ELSE i.paid_at END,
       currency    = coalesce(i.currency, EXCLUDED.currency),
       updated_at  = now()
 WHERE i.status = ANY ($7::text[])`

// payInvoice: the parameters of upsertInvoice with target 'paid', then
// $8 event_id, $9 outbox event_type, $10 outbox payload. In one statement:
// moves the invoice to paid (or creates it paid), books the payment and
// queues the notification. It returns whether it moved the invoice, and the
// invoice's status as this statement's snapshot saw it (NULL if absent).
//
// When the transition is refused, ON CONFLICT DO UPDATE has still locked the
// row and checked the latest version: that one is paid or void. Both are
// final, so a snapshot status of paid or void is the latest one. Any other
// snapshot status means the row changed after the snapshot was taken; the
// caller then reads it with invoiceStatus in a new statement.
const payInvoice = `
WITH paid AS (` + upsertInvoice + `
RETURNING i.id
), booked AS (
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
SELECT id, 'payment', $6, $4, $8 FROM paid
ON CONFLICT DO NOTHING
RETURNING id
), queued AS (
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'Invoice', $1, $9, $10::jsonb FROM booked
)
SELECT EXISTS (SELECT FROM paid), (SELECT status FROM invoices WHERE id = $1)`

// invoiceStatus: $1 id. Locks the row so the decision that follows (book or
// raise an anomaly) cannot race a concurrent transition.
const invoiceStatus = `SELECT status FROM invoices WHERE id = $1 FOR UPDATE`

// bookLedgerEntry: $1 invoice_id, $2 kind, $3 amount, $4 currency,
// $5 event_id. Returns a row only when the entry is new.
const bookLedgerEntry = `
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING
RETURNING id`

// raiseAnomaly: $1 kind, $2 subject_id, $3 endpoint, $4 event_id, $5 detail.
const raiseAnomaly = `
INSERT INTO anomalies (kind, subject_id, endpoint, event_id, detail)
VALUES ($1, $2, $3, $4, $5::jsonb)
ON CONFLICT (kind, subject_id) DO NOTHING`

// countUnresolvedAnomalies: no parameters.
const countUnresolvedAnomalies = `SELECT count(*) FROM anomalies WHERE resolved_at IS NULL`
