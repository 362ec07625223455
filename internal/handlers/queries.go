package handlers

import (
	"fmt"
	"strings"

	"github.com/stripe-inbox/inbox/internal/outbox"
)

// The SQL of the business tables (invoices, ledger_entries, refunds,
// payment_links, anomalies), as the handlers write them. Outbox rows are
// queued with internal/outbox's INSERT (outbox.InsertRowsSQL), composed
// into these statements.
// Invoice status transitions follow Stripe's lifecycle:
//
//	draft -> open -> paid
//	           |  -> void
//	           |  -> uncollectible -> paid | void
//
// paid and void are final, but for one move Stripe never makes: a payment
// processed on a void invoice moves it to paid (void -> paid, invoicePaid:
// the payment is booked and a human told), so that a payment and a void
// end the same in either order. Every statement is an upsert that admits
// only these transitions, so a late or repeated event changes no status (it
// may still update the descriptive fields, when its snapshot is newer).

// upsertInvoice: $1 id, $2 customer, $3 target status, $4 currency,
// $5 amount_due, $6 amount_paid, $7 statuses the target may replace,
// $8 the event's created (seconds), $9 the target's status rank,
// $10 event id, $11 account (NULL: the platform's own; an invoice is
// (id, account), see migrations/0017). Inserts the invoice in the target state when absent (events
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
                           snapshot_created, snapshot_rank, snapshot_event_id, account)
VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $3 = 'paid' THEN now() END, $8, $9, $10, $11::text)
ON CONFLICT (id, account) DO UPDATE
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
// $12 the payment's outbox payload, $13 the payments (ch_/pi_ ids) the
// invoice names, $14 the amount paid through Stripe, $15 the amount paid
// outside Stripe, $16 the out-of-band payment's outbox payload. In one
// statement: moves the invoice to paid (or creates it paid), books the
// payment ('payment', $14, unless the invoice was paid wholly outside
// Stripe) and the money paid outside Stripe ('paid_out_of_band', $15, when
// above 0), queues one notification per entry booked, records the
// write-back intent (in the statements with one, see payInvoiceSQL) and
// records the payment links (see linkPayments). It returns the invoice's
// status after this statement when the statement changed the row (NULL
// otherwise), the status as this statement's snapshot saw it (NULL if
// absent), and whether refunds of the payments may still be booked under
// another key than their invoice (then the caller runs attributeRefunds).
//
// The payment is booked when the row it returns is paid: either it moved it
// to paid, or the invoice was already paid and only its descriptive fields
// changed, when the booking is already there (ON CONFLICT DO NOTHING). When
// the statement did not change the row, ON CONFLICT DO UPDATE has still
// locked the row and checked the latest version: its status is one $7 does
// not hold. paid is final, so a snapshot status of paid is the latest one;
// any other (void included: a payment may have moved it to paid since)
// means the row may have changed after the snapshot was taken, and the
// caller reads it with invoiceStatus in a new statement. invoicePaid runs it
// with $7 the states before paid, and once more with $7 void when the row
// it locked is void.
//
// payInvoice is its four statements (payInvoiceSQL), indexed by whether the
// invoice names a Stripe payment and whether the customer_metadata
// write-back is on.
var payInvoice = [2][2]string{
	{payInvoiceSQL(false, false), payInvoiceSQL(false, true)},
	{payInvoiceSQL(true, false), payInvoiceSQL(true, true)},
}

// payInvoiceSQL is payInvoice for an invoice that names a Stripe payment
// (links) or none, with the customer_metadata write-back on (writeback) or
// off. Issue 24: PostgreSQL starts every data-modifying CTE's executor node
// on each execution, even one that inserts nothing, so a statement holds
// only the parts its receipt can use:
//   - links: the payment links and the probe for refunds and disputes to
//     attribute; without it (no charge, no payments list, or only payment
//     records) the third value is always false, and the statement took a
//     third less time;
//   - writeback: the write-back intent (only when it booked the payment,
//     only for the platform's own invoice with a customer; see
//     writebacks.go); off by default (WRITEBACKS).
func payInvoiceSQL(links, writeback bool) string {
	sql := payInvoiceBooking
	if writeback {
		sql += `, intended AS (
INSERT INTO writeback_intents (kind, target, params, idempotency_key, event_id)
SELECT '` + WritebackCustomerMetadata + `', $2::text,
       jsonb_build_object('metadata', jsonb_build_object('` + LastPaidInvoiceKey + `', $1::text)),
       ` + customerMetadataKeySQL + `, $10::text
  FROM booked WHERE kind = 'payment' AND coalesce($2::text, '') <> '' AND $11::text IS NULL
ON CONFLICT (idempotency_key) DO NOTHING
)`
	}
	if !links {
		return sql + `
SELECT (SELECT status FROM paid), (SELECT status FROM invoices WHERE id = $1 AND account IS NOT DISTINCT FROM $11),
       coalesce(cardinality($13::text[]), 0) > 0`
	}
	return sql + `, linked AS (` + linkPaymentsCTE("$13", "$11") + `
)
SELECT (SELECT status FROM paid), (SELECT status FROM invoices WHERE id = $1 AND account IS NOT DISTINCT FROM $11),
       coalesce((SELECT bool_or(has_refunds) FROM linked), false) OR ` + unattributedOf13
}

// payInvoiceBooking is what every payInvoice statement holds: the
// invoice's move to paid, the entries and their outbox rows.
const payInvoiceBooking = `
WITH paid AS (` + upsertInvoice + `
RETURNING i.id, i.status
), booked AS (
INSERT INTO ledger_entries (invoice_id, kind, amount, currency, event_id, account)
SELECT id, k.kind, k.amount, $4::text, $10::text, $11::text
  FROM paid, (VALUES ('payment', $14::bigint), ('paid_out_of_band', $15::bigint)) AS k (kind, amount)
 WHERE status = 'paid' AND (k.amount > 0 OR (k.kind = 'payment' AND $15::bigint = 0))
ON CONFLICT DO NOTHING
RETURNING kind
), queued AS (
` + outbox.InsertRowsSQL + `
SELECT 'Invoice', $1, CASE kind WHEN 'payment' THEN 'InvoicePaymentBooked' ELSE 'InvoicePaidOutOfBand' END,
       CASE kind WHEN 'payment' THEN $12::jsonb ELSE $16::jsonb END FROM booked
)`

// linkPaymentsCTE: $1 invoice id, and the payment ids (sorted, so that
// concurrent statements lock them in one order) and the account in the
// parameters payments and account ("$13", "$11"). Records that the payments paid the invoice.
// A link, once known, is kept (a payment pays one invoice). A row without
// invoice_id was left by a refund seen before the link (applyRefunds); this
// is when its entries must move to the invoice.
func linkPaymentsCTE(payments, account string) string {
	return `
INSERT INTO payment_links AS l (payment_id, invoice_id, account)
SELECT p, $1::text, ` + account + `::text FROM unnest(` + payments + `::text[]) AS p ORDER BY p
ON CONFLICT (payment_id, account) DO UPDATE
   SET invoice_id = EXCLUDED.invoice_id, updated_at = now()
 WHERE l.invoice_id IS NULL
RETURNING l.has_refunds`
}

// transitionLinking: the parameters of upsertInvoice, then $12 the
// payments (ch_/pi_ ids, sorted) the invoice names. upsertInvoice and the
// payments' links (linkPaymentsCTE) in one statement, one round trip
// instead of two (issue 24), in the order every statement takes the rows:
// the invoice's row (the first column reads moved, so it runs first), then
// the links. Returns how many rows the upsert changed, and whether refunds
// of the payments may still be booked under another key than their
// invoice (then the caller runs attributeRefunds), as linkPayments.
var transitionLinking = `
WITH moved AS (` + upsertInvoice + `
RETURNING i.id
), linked AS (` + linkPaymentsCTE("$12", "$11") + `
)
SELECT (SELECT count(*) FROM moved), coalesce((SELECT bool_or(has_refunds) FROM linked), false) OR ` + unattributedOf12

// linkPayments: $1 invoice id, $2 payment ids (sorted), $3 account. See linkPaymentsCTE.
// Returns whether refunds of the payments may still be booked under another
// key than their invoice (then the caller runs attributeRefunds).
var linkPayments = `
WITH linked AS (` + linkPaymentsCTE("$2", "$3") + `
)
SELECT coalesce((SELECT bool_or(has_refunds) FROM linked), false) OR ` + unattributedOf2

// unattributedOf: whether the statement's snapshot holds a refund or a
// dispute of the payments (the first parameter: an array of ch_/py_/pi_
// ids; the second: the account) that no event has attributed to an invoice
// yet. The link row's has_refunds (read from its
// latest version, so it sees a refund committed after the snapshot) covers
// every refund an event has shown with that payment; this also covers rows
// no event has marked (refunds recorded by migration 0005's backfill).
const unattributedOf = `EXISTS (SELECT 1 FROM refunds
         WHERE (charge_id = ANY (%[1]s::text[]) OR payment_intent_id = ANY (%[1]s::text[])) AND invoice_id IS NULL
           AND account IS NOT DISTINCT FROM %[2]s::text)
   OR EXISTS (SELECT 1 FROM disputes
         WHERE (charge_id = ANY (%[1]s::text[]) OR payment_intent_id = ANY (%[1]s::text[])) AND invoice_id IS NULL
           AND account IS NOT DISTINCT FROM %[2]s::text)`

var (
	unattributedOf2  = fmt.Sprintf(unattributedOf, "$2", "$3")
	unattributedOf12 = fmt.Sprintf(unattributedOf, "$12", "$11")
	unattributedOf13 = fmt.Sprintf(unattributedOf, "$13", "$11")
)

// refundEntries is the tail of a statement that books what refund rows call
// for: from a CTE named refund_rows with the rows' id, amount, currency,
// status, succeeded, booked_under and account, and $EVENT (the event id parameter,
// see withEvent). Each entry is inserted under the row's booked_under once,
// and an entry already booked under another key is moved there (an UPDATE
// of invoice_id only, never of the amount). ON CONFLICT DO UPDATE sees the entry's latest version, not the
// statement's snapshot, so an entry a concurrent transaction committed after
// the snapshot is moved too; and every statement that writes a refund's
// entries holds its refunds row's lock, so the row it read is the latest.
//
//	'refund:<id>'          -amount   if some event showed it succeeded
//	'refund_reversal:<id>' +amount   if so, and its highest status is failed or canceled
const refundEntries = refundEntriesCTE + `
` + refundReversals

// refundEntriesCTE and refundReversals are refundEntries' two parts: the
// refund entries (a CTE) and the reversals (a statement, or, in
// attributeRefunds, a CTE of its own).
const (
	refundEntriesCTE = `
, refunded AS (
INSERT INTO ledger_entries AS e (invoice_id, kind, amount, currency, event_id, account)
SELECT r.booked_under, 'refund:' || r.id, -r.amount, r.currency, $EVENT::text, r.account FROM refund_rows AS r WHERE r.succeeded
ON CONFLICT (kind, account) WHERE kind LIKE 'refund:%'
DO UPDATE SET invoice_id = EXCLUDED.invoice_id
 WHERE e.invoice_id <> EXCLUDED.invoice_id
)`
	refundReversals = `INSERT INTO ledger_entries AS e (invoice_id, kind, amount, currency, event_id, account)
SELECT r.booked_under, 'refund_reversal:' || r.id, r.amount, r.currency, $EVENT::text, r.account FROM refund_rows AS r
 WHERE r.succeeded AND r.status IN ('failed', 'canceled')
ON CONFLICT (kind, account) WHERE kind LIKE 'refund\_reversal:%'
DO UPDATE SET invoice_id = EXCLUDED.invoice_id
 WHERE e.invoice_id <> EXCLUDED.invoice_id`
)

// withEvent puts the event id parameter into refundEntries.
func withEvent(sql, param string) string { return strings.ReplaceAll(sql, "$EVENT", param) }

// attributeRefunds: $1 invoice id, $2 payment ids (sorted), $3 event id,
// $4 account. Run by an event that linked the payments to the invoice:
// records the invoice on their refunds and disputes that had none (locking
// them in id order) and moves their entries there (see refundEntries and
// disputeEntries), in one statement (issue 24: one round trip, not two).
// It runs after the statement that locked the link rows, so its snapshot
// holds every refund and dispute that names these payments: a transaction
// that records one takes the link row first (applyRefunds, applyDispute).
// The two parts touch different rows (refunds, disputes, and ledger
// entries of different kinds), and the link rows this transaction holds
// keep any other statement from touching them meanwhile.
var attributeRefunds = `
WITH ` + attributeRows("refunds", "refund_rows", "x.id, x.amount, x.currency, x.status, x.succeeded, x.booked_under, x.account") +
	withEvent(refundEntriesCTE, "$3") + `
, reversed AS (
` + withEvent(refundReversals, "$3") + `
), ` + attributeRows("disputes", "dispute_rows", `x.id, x.account, x.charge_id, x.payment_intent_id, x.booked_under,
          x.withdrawn_amount, x.withdrawn_currency, x.reinstated_amount, x.reinstated_currency`) +
	withEvent(disputeEntries, "$3")

// attributeRows is attributeRefunds' part for one table (refunds or
// disputes): a CTE that locks, in id order, the rows of the payments ($2)
// and account ($4) that name no invoice, and one, named rows, that records
// the invoice ($1) on them and returns the columns returning (of x).
func attributeRows(table, rows, returning string) string {
	return `locked_` + table + ` AS (
SELECT id FROM ` + table + `
 WHERE (charge_id = ANY ($2::text[]) OR payment_intent_id = ANY ($2::text[])) AND invoice_id IS NULL
   AND account IS NOT DISTINCT FROM $4::text
 ORDER BY id
   FOR UPDATE
), ` + rows + ` AS (
UPDATE ` + table + ` AS x
   SET invoice_id = $1::text, updated_at = now()
  FROM locked_` + table + ` AS locked
 WHERE x.id = locked.id AND x.account IS NOT DISTINCT FROM $4::text AND x.invoice_id IS NULL
RETURNING ` + returning + `
)`
}

// applyRefunds: $1 refund ids (distinct), $2 their charge ids, $3 their
// payment intent ids (NULL when unknown), $4 amounts (positive), $5
// currencies, $6 statuses, $7 event id, $8 the payment ids among $2 and $3
// (sorted, distinct), $9 account. The refunds of one event: one for a
// refund.* event, every one a charge.refunded lists, in one statement and
// one round trip (issue 24).
//
// In one statement: takes the payment link rows first (every statement that
// touches both takes the links before the refunds, so they cannot
// deadlock), merges each observation into its refund's row (in id order),
// and books the entries each row calls for under its booked_under
// (refundEntries).
//
// The row is a merge that does not depend on order (highest-ranked status,
// ties by name; succeeded = any observation succeeded; the invoice, charge
// and PaymentIntent once known are kept), and the entries are a function of
// it, so any order of the same events ends with the same entries
// (invoice_id, kind, amount, currency). A refund that went
// succeeded -> failed is booked and reversed even when the failure is
// processed first; one that went pending -> failed books nothing.
//
// The invoice: a link of a payment the refund names (read from the link
// row's latest version) gives it, unless the row already has one. The
// booked_under the statement books under is the one ON CONFLICT DO UPDATE
// computed from the refund row's latest version, so concurrent transactions
// agree; when this event is the one that reveals the invoice, it also moves
// the entries booked under the charge before.
var applyRefunds = `
WITH linked AS (
INSERT INTO payment_links AS l (payment_id, has_refunds, account)
SELECT p, true, $9::text FROM unnest($8::text[]) AS p ORDER BY p
ON CONFLICT (payment_id, account) DO UPDATE SET has_refunds = true
RETURNING l.payment_id, l.invoice_id
), refund_rows AS (
INSERT INTO refunds AS r (id, charge_id, payment_intent_id, invoice_id, amount, currency, status, succeeded, account)
SELECT k.id, k.charge_id, k.payment_intent_id,
       (SELECT min(l.invoice_id) FROM linked AS l WHERE l.payment_id IN (k.charge_id, k.payment_intent_id)),
       k.amount, k.currency, k.status, k.status = 'succeeded', $9::text
  FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[])
       AS k (id, charge_id, payment_intent_id, amount, currency, status)
 ORDER BY k.id
ON CONFLICT (id, account) DO UPDATE
   -- The rank: pending, requires_action 0 < succeeded 1 < failed, canceled 2.
   SET status            = CASE WHEN (CASE EXCLUDED.status WHEN 'succeeded' THEN 1 WHEN 'failed' THEN 2 WHEN 'canceled' THEN 2 ELSE 0 END, EXCLUDED.status)
                                   > (CASE r.status WHEN 'succeeded' THEN 1 WHEN 'failed' THEN 2 WHEN 'canceled' THEN 2 ELSE 0 END, r.status)
                                THEN EXCLUDED.status ELSE r.status END,
       succeeded         = r.succeeded OR EXCLUDED.succeeded,
       charge_id         = coalesce(r.charge_id, EXCLUDED.charge_id),
       payment_intent_id = coalesce(r.payment_intent_id, EXCLUDED.payment_intent_id),
       invoice_id        = coalesce(r.invoice_id, EXCLUDED.invoice_id),
       currency          = coalesce(r.currency, EXCLUDED.currency),
       updated_at        = now()
RETURNING r.id, r.amount, r.currency, r.status, r.succeeded, r.booked_under, r.account
)` + withEvent(refundEntries, "$7")

// invoiceStatus: $1 id, $2 account. Locks the row so the decision that follows (book or
// raise an anomaly) cannot race a concurrent transition.
const invoiceStatus = `SELECT status FROM invoices WHERE id = $1 AND account IS NOT DISTINCT FROM $2::text FOR UPDATE`

// raiseAnomaly: $1 kind, $2 subject_id, $3 endpoint, $4 event_id, $5 detail,
// $6 account.
const raiseAnomaly = `
INSERT INTO anomalies (kind, subject_id, endpoint, event_id, detail, account)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::text)
ON CONFLICT (kind, subject_id, account) DO NOTHING`

// countUnresolvedAnomalies: no parameters.
const countUnresolvedAnomalies = `SELECT count(*) FROM anomalies WHERE resolved_at IS NULL`

// voidInvoice: the parameters of upsertInvoice with target 'void', then
// $12 the payments (ch_/pi_ ids, sorted) the invoice names. Moves the
// invoice to void and records the payments' links (linkPaymentsCTE), in
// that order, in one statement. Returns the invoice's status after this
// statement when it changed the row (NULL otherwise) and the status as its
// snapshot saw it, as payInvoice does (a void that finds the invoice paid
// raises an anomaly, invoiceVoided), and whether refunds of the payments
// may still be booked under another key (then the caller runs
// attributeRefunds).
var voidInvoice = `
WITH voided AS (` + upsertInvoice + `
RETURNING i.status
), linked AS (` + linkPaymentsCTE("$12", "$11") + `
)
SELECT (SELECT status FROM voided), (SELECT status FROM invoices WHERE id = $1 AND account IS NOT DISTINCT FROM $11),
       coalesce((SELECT bool_or(has_refunds) FROM linked), false) OR ` + unattributedOf12

// disputeEntries is the tail of a statement that books what dispute rows
// call for: from a CTE named dispute_rows with the rows' id, account,
// charge_id, payment_intent_id, booked_under, withdrawn_amount,
// withdrawn_currency, reinstated_amount and reinstated_currency, and $EVENT
// (the event id parameter, see withEvent). As refundEntries: each movement
// is inserted once under the row's booked_under, and an entry booked under
// another key is moved there (an UPDATE of invoice_id only, never of an
// amount). Each entry this event inserts (event_id = $EVENT: a moved entry
// keeps the event that booked it) queues one outbox row.
//
//	'dispute_funds_withdrawn:<id>'   withdrawn_amount  (< 0) once withdrawn
//	'dispute_funds_reinstated:<id>'  reinstated_amount (> 0) once reinstated
const disputeEntries = `
, withdrawn AS (
INSERT INTO ledger_entries AS e (invoice_id, kind, amount, currency, event_id, account)
SELECT d.booked_under, 'dispute_funds_withdrawn:' || d.id, d.withdrawn_amount, d.withdrawn_currency, $EVENT::text, d.account
  FROM dispute_rows AS d WHERE d.withdrawn_amount IS NOT NULL
ON CONFLICT (kind, account) WHERE kind LIKE 'dispute\_%'
DO UPDATE SET invoice_id = EXCLUDED.invoice_id
 WHERE e.invoice_id <> EXCLUDED.invoice_id
RETURNING e.invoice_id, e.kind, e.amount, e.currency, e.event_id
), reinstated AS (
INSERT INTO ledger_entries AS e (invoice_id, kind, amount, currency, event_id, account)
SELECT d.booked_under, 'dispute_funds_reinstated:' || d.id, d.reinstated_amount, d.reinstated_currency, $EVENT::text, d.account
  FROM dispute_rows AS d WHERE d.reinstated_amount IS NOT NULL
ON CONFLICT (kind, account) WHERE kind LIKE 'dispute\_%'
DO UPDATE SET invoice_id = EXCLUDED.invoice_id
 WHERE e.invoice_id <> EXCLUDED.invoice_id
RETURNING e.invoice_id, e.kind, e.amount, e.currency, e.event_id
), booked AS (
SELECT * FROM withdrawn WHERE event_id = $EVENT::text
UNION ALL
SELECT * FROM reinstated WHERE event_id = $EVENT::text
)
` + outbox.InsertRowsSQL + `
SELECT 'Dispute', d.id,
       CASE WHEN b.kind LIKE 'dispute\_funds\_withdrawn:%' THEN 'DisputeFundsWithdrawn' ELSE 'DisputeFundsReinstated' END,
       jsonb_build_object('dispute_id', d.id, 'account', d.account, 'charge_id', d.charge_id, 'payment_intent_id', d.payment_intent_id,
                          'booked_under', b.invoice_id, 'kind', b.kind, 'amount', b.amount, 'currency', b.currency, 'event_id', b.event_id)
  FROM booked AS b, dispute_rows AS d
 ORDER BY b.kind`

// applyDispute: $1 dispute id, $2 charge id, $3 payment intent id (NULL
// when unknown), $4 the dispute's amount, $5 currency, $6 status, $7 event
// id, $8 the payment ids among $2 and $3 (sorted), $9 account, $10 and $11
// the withdrawn amount (< 0) and its currency, $12 and $13 the reinstated
// amount (> 0) and its currency (NULL when this event does not show the
// movement).
//
// As applyRefunds, in one statement: takes the payment link rows first,
// merges this observation into the dispute's row and books the entries the
// row calls for under its booked_under (disputeEntries). The merge does not
// depend on order: the highest-ranked status (ties by name); the charge,
// PaymentIntent and invoice once known are kept; each movement's amount is
// the first one an event showed, never changed after.
var applyDispute = `
WITH linked AS (
INSERT INTO payment_links AS l (payment_id, has_refunds, account)
SELECT p, true, $9::text FROM unnest($8::text[]) AS p ORDER BY p
ON CONFLICT (payment_id, account) DO UPDATE SET has_refunds = true
RETURNING l.invoice_id
), dispute_rows AS (
INSERT INTO disputes AS d (id, account, charge_id, payment_intent_id, invoice_id, amount, currency, status,
                           withdrawn_amount, withdrawn_currency, reinstated_amount, reinstated_currency)
SELECT $1::text, $9::text, $2::text, $3::text, (SELECT min(invoice_id) FROM linked), $4::bigint, $5::text, $6::text,
       $10::bigint, $11::text, $12::bigint, $13::text
ON CONFLICT (id, account) DO UPDATE
   SET status              = CASE WHEN (` + disputeRank("EXCLUDED.status") + `, EXCLUDED.status) > (` + disputeRank("d.status") + `, d.status)
                                  THEN EXCLUDED.status ELSE d.status END,
       charge_id           = coalesce(d.charge_id, EXCLUDED.charge_id),
       payment_intent_id   = coalesce(d.payment_intent_id, EXCLUDED.payment_intent_id),
       invoice_id          = coalesce(d.invoice_id, EXCLUDED.invoice_id),
       currency            = coalesce(d.currency, EXCLUDED.currency),
       withdrawn_amount    = coalesce(d.withdrawn_amount, EXCLUDED.withdrawn_amount),
       withdrawn_currency  = CASE WHEN d.withdrawn_amount IS NULL THEN EXCLUDED.withdrawn_currency ELSE d.withdrawn_currency END,
       reinstated_amount   = coalesce(d.reinstated_amount, EXCLUDED.reinstated_amount),
       reinstated_currency = CASE WHEN d.reinstated_amount IS NULL THEN EXCLUDED.reinstated_currency ELSE d.reinstated_currency END,
       updated_at          = now()
RETURNING d.id, d.account, d.charge_id, d.payment_intent_id, d.booked_under,
          d.withdrawn_amount, d.withdrawn_currency, d.reinstated_amount, d.reinstated_currency
)` + withEvent(disputeEntries, "$7")

// disputeRank is the rank of a dispute status: the warning_ (inquiry) and
// the chargeback statuses each go needs_response < under_review < closed
// (won, lost, prevented, warning_closed), and never back.
func disputeRank(status string) string {
	return `(CASE ` + status + ` WHEN 'needs_response' THEN 0 WHEN 'warning_needs_response' THEN 0
        WHEN 'under_review' THEN 1 WHEN 'warning_under_review' THEN 1 ELSE 2 END)`
}
