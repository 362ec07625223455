-- Book only real money (issue 13, points 1-4).
--
-- The runner applies this file in one transaction, so every lock it takes is
-- held until the end of the file. A deploy that cannot get a lock within 5s
-- (say, a long query holds webhook_inbox) fails and rolls back, instead of
-- queueing every webhook insert behind its own waiting ACCESS EXCLUSIVE
-- request; deploy again when the query is gone.
SET LOCAL lock_timeout = '5s';

-- 1. Every refund seen, merged from every event that showed it, in any order:
--    status is the highest-ranked status seen (pending, requires_action <
--    succeeded < failed, canceled; ties by name, so the merge is the same in
--    any order), and succeeded records whether any event showed it succeeded.
--    The refund's ledger entries are a function of this row (and of the
--    payment link below), see internal/handlers/refunds.go:
--      'refund:<id>'          -amount  when succeeded
--      'refund_reversal:<id>' +amount  when succeeded and status is failed or canceled
--
--    The entries sit under booked_under: the refund's invoice once any event
--    has told it (invoice_id: a link of its charge or PaymentIntent, see
--    payment_links), else its charge, else its PaymentIntent, else its own
--    id. Both entries are always booked, and moved, under the row's
--    booked_under, in the statement that changes the row, so a refund and its
--    reversal are always under one key, and under the invoice as soon as any
--    event has revealed it. Moving changes ledger_entries.invoice_id only,
--    never an amount.
CREATE TABLE refunds (
    id                text        PRIMARY KEY,          -- re_...
    charge_id         text,                             -- ch_... or py_...
    payment_intent_id text,                             -- pi_...
    invoice_id        text,                             -- in_..., once known; then never changes
    booked_under      text        GENERATED ALWAYS AS (coalesce(invoice_id, charge_id, payment_intent_id, id)) STORED,
    amount            bigint      NOT NULL,             -- positive, minor units
    currency          text,
    status            text        NOT NULL CHECK (status IN ('pending', 'requires_action', 'succeeded', 'failed', 'canceled')),
    succeeded         boolean     NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refunds_charge ON refunds (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX refunds_payment_intent ON refunds (payment_intent_id) WHERE payment_intent_id IS NOT NULL;

-- A reversal is booked once per refund, like the refund itself.
CREATE UNIQUE INDEX ledger_entries_refund_reversal_once
    ON ledger_entries (kind)
    WHERE kind LIKE 'refund\_reversal:%';

-- 2. Which invoice a payment (a charge ch_... or a PaymentIntent pi_...)
--    paid, recorded by every event that tells it. A refund is booked against
--    the invoice of its charge (or PaymentIntent) when the link is known, and
--    against the charge id until then; the event that records the link moves
--    such entries to the invoice. invoice_id is NULL when a refund was seen
--    before any link: the row is then a lock point that the refund's
--    booking and the link's recording take in turn (has_refunds tells the
--    linking event that there may be entries to move).
CREATE TABLE payment_links (
    payment_id  text        PRIMARY KEY,
    invoice_id  text,
    has_refunds boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Refunds booked before this migration were booked whatever their status.
-- Record them as succeeded (that is what the ledger says), so that a later
-- failure of one reverses it and a later success does not book it again,
-- and under the key they are booked under: the invoice (old charge.refunded
-- with the charge's invoice), the charge (ch_... or py_...; old
-- refund.created, or charge.refunded without an invoice), or the refund's
-- own id (old refund.created without a charge). booked_under is then that
-- key, so a later event books the reversal next to it. Charges are marked
-- (payment_links.has_refunds) so that a later link moves their refunds to
-- the invoice. An operator checks them against Stripe (README, operator SQL).
INSERT INTO refunds (id, charge_id, invoice_id, amount, currency, status, succeeded)
SELECT substr(kind, length('refund:') + 1),
       CASE WHEN invoice_id LIKE 'ch\_%' OR invoice_id LIKE 'py\_%' THEN invoice_id END,
       CASE WHEN invoice_id NOT LIKE 'ch\_%' AND invoice_id NOT LIKE 'py\_%' AND invoice_id <> substr(kind, length('refund:') + 1) THEN invoice_id END,
       -amount, currency, 'succeeded', true
  FROM ledger_entries
 WHERE kind LIKE 'refund:%'
ON CONFLICT (id) DO NOTHING;

INSERT INTO payment_links (payment_id, has_refunds)
SELECT DISTINCT charge_id, true
  FROM refunds
 WHERE charge_id IS NOT NULL
ON CONFLICT (payment_id) DO NOTHING;

-- 3. The snapshot the descriptive fields (customer_id, currency, amount_due)
--    come from: the newest by the event's created, ties broken by status
--    rank, then by event id, so the same set of events leaves the same values
--    in any order. Rows from before this migration count as oldest.
ALTER TABLE invoices
    ADD COLUMN snapshot_created  bigint   NOT NULL DEFAULT 0,
    ADD COLUMN snapshot_rank     smallint NOT NULL DEFAULT 0,
    ADD COLUMN snapshot_event_id text     NOT NULL DEFAULT '';

-- 5. A receipt of the other Stripe mode (a test-mode event on a deployment
--    that books live money, or the reverse) is stored and marked processed
--    with its own outcome, so an operator can tell it from a type without a
--    handler.
--
--    Last in this file on purpose: ALTER TABLE takes an ACCESS EXCLUSIVE lock
--    on webhook_inbox, which blocks the webhook's inserts (and the worker's
--    claims) until this transaction commits. Here it is held only from these
--    two statements to the commit. The new constraint is NOT VALID: the old
--    rows all satisfy the old, narrower check, so nothing needs scanning
--    under that lock; migration 0010 validates it in a transaction of its
--    own, with a lock (SHARE UPDATE EXCLUSIVE) that does not block inserts.
ALTER TABLE webhook_inbox DROP CONSTRAINT webhook_inbox_outcome_check;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_outcome_check
    CHECK (outcome IN ('applied', 'ignored', 'ignored_other_mode')) NOT VALID;
