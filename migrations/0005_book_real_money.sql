-- Book only real money (issue 13, points 1-4).

-- 1. A receipt of the other Stripe mode (a test-mode event on a deployment
--    that books live money, or the reverse) is stored and marked processed
--    with its own outcome, so an operator can tell it from a type without a
--    handler. NOT VALID then VALIDATE: the check of the existing rows does not
--    block the webhook's inserts.
ALTER TABLE webhook_inbox DROP CONSTRAINT webhook_inbox_outcome_check;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_outcome_check
    CHECK (outcome IN ('applied', 'ignored', 'ignored_other_mode')) NOT VALID;
ALTER TABLE webhook_inbox VALIDATE CONSTRAINT webhook_inbox_outcome_check;

-- 2. Every refund seen, merged from every event that showed it, in any order:
--    status is the highest-ranked status seen (pending, requires_action <
--    succeeded < failed, canceled; ties by name, so the merge is the same in
--    any order), and succeeded records whether any event showed it succeeded.
--    The refund's ledger entries are a function of this row (and of the
--    payment link below), see internal/handlers/refunds.go:
--      'refund:<id>'          -amount  when succeeded
--      'refund_reversal:<id>' +amount  when succeeded and status is failed or canceled
CREATE TABLE refunds (
    id                text        PRIMARY KEY,          -- re_...
    charge_id         text,                             -- ch_...
    payment_intent_id text,                             -- pi_...
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

-- 3. Which invoice a payment (a charge ch_... or a PaymentIntent pi_...)
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
-- failure of one reverses it and a later success does not book it again, and
-- mark their charges so that a later link moves them to the invoice. An
-- operator checks them against Stripe (README, operator SQL).
INSERT INTO refunds (id, charge_id, amount, currency, status, succeeded)
SELECT substr(kind, length('refund:') + 1), CASE WHEN invoice_id LIKE 'ch\_%' THEN invoice_id END, -amount, currency, 'succeeded', true
  FROM ledger_entries
 WHERE kind LIKE 'refund:%'
ON CONFLICT (id) DO NOTHING;

INSERT INTO payment_links (payment_id, has_refunds)
SELECT DISTINCT invoice_id, true
  FROM ledger_entries
 WHERE kind LIKE 'refund:%' AND invoice_id LIKE 'ch\_%'
ON CONFLICT (payment_id) DO NOTHING;

-- 4. The snapshot the descriptive fields (customer_id, currency, amount_due)
--    come from: the newest by the event's created, ties broken by status
--    rank, then by event id, so the same set of events leaves the same values
--    in any order. Rows from before this migration count as oldest.
ALTER TABLE invoices
    ADD COLUMN snapshot_created  bigint   NOT NULL DEFAULT 0,
    ADD COLUMN snapshot_rank     smallint NOT NULL DEFAULT 0,
    ADD COLUMN snapshot_event_id text     NOT NULL DEFAULT '';
