-- The rest of the money (issue 23): disputes, payments outside Stripe, and
-- the connected account every business row belongs to.
--
-- The runner applies this file in one transaction, so every lock it takes is
-- held until the end of the file. A deploy that cannot get a lock within 5s
-- fails and rolls back instead of queueing the worker behind it; deploy
-- again. The tables below are the worker's only (the webhook never touches
-- them): while this runs, processing waits and receipts keep arriving.
SET LOCAL lock_timeout = '5s';

-- 1. Connected accounts. A Connect endpoint receives the events of many
--    accounts (the event's `account`, webhook_inbox.account), whose object
--    ids are unique only within their account. Every business row records
--    the account it belongs to: NULL is the platform's own. Each key that
--    was an object id becomes (id, account), NULLS NOT DISTINCT so that the
--    platform's rows (NULL) still collide with each other. Adding a nullable
--    column without a default rewrites nothing; the unique indexes are built
--    here (the tables are the worker's: a build blocks processing, not
--    receipt).
ALTER TABLE invoices       ADD COLUMN account text;
ALTER TABLE ledger_entries ADD COLUMN account text;
ALTER TABLE refunds        ADD COLUMN account text;
ALTER TABLE payment_links  ADD COLUMN account text;
ALTER TABLE anomalies      ADD COLUMN account text;

ALTER TABLE invoices DROP CONSTRAINT invoices_pkey;
ALTER TABLE invoices ADD CONSTRAINT invoices_id_account UNIQUE NULLS NOT DISTINCT (id, account);

ALTER TABLE refunds DROP CONSTRAINT refunds_pkey;
ALTER TABLE refunds ADD CONSTRAINT refunds_id_account UNIQUE NULLS NOT DISTINCT (id, account);

ALTER TABLE payment_links DROP CONSTRAINT payment_links_pkey;
ALTER TABLE payment_links ADD CONSTRAINT payment_links_payment_account UNIQUE NULLS NOT DISTINCT (payment_id, account);

ALTER TABLE anomalies DROP CONSTRAINT anomalies_kind_subject_id_key;
ALTER TABLE anomalies ADD CONSTRAINT anomalies_kind_subject_account UNIQUE NULLS NOT DISTINCT (kind, subject_id, account);

-- Rows booked before this migration from a connected account's events were
-- recorded without it. Where the receipts that booked them are still kept
-- (RETENTION_DAYS), they get their account back, so that a later event of
-- that account (a refund, a dispute, a second Event object) finds them
-- rather than starting a row of its own: the ledger entries and anomalies
-- by the receipt that booked or raised them, invoices and refunds by the
-- receipts about them (only when those all name one account), refunds also
-- by their entries, payment links by their invoice or refunds. Rows whose
-- receipts were purged stay NULL (docs/operations.md, "Connected accounts
-- before migration 0017"). This reads webhook_inbox once per table (no lock
-- that blocks the webhook's inserts).
UPDATE ledger_entries e SET account = w.account
  FROM webhook_inbox w
 WHERE w.event_id = e.event_id AND w.account IS NOT NULL;

UPDATE anomalies a SET account = w.account
  FROM webhook_inbox w
 WHERE w.event_id = a.event_id AND w.endpoint = a.endpoint AND w.account IS NOT NULL;

UPDATE invoices i SET account = w.account
  FROM (SELECT object_id, min(account) AS account FROM webhook_inbox
         WHERE account IS NOT NULL AND object_id IS NOT NULL
         GROUP BY object_id HAVING count(DISTINCT account) = 1) w
 WHERE w.object_id = i.id;

UPDATE refunds r SET account = w.account
  FROM (SELECT object_id, min(account) AS account FROM webhook_inbox
         WHERE account IS NOT NULL AND object_id IS NOT NULL
         GROUP BY object_id HAVING count(DISTINCT account) = 1) w
 WHERE w.object_id = r.id;
UPDATE refunds r SET account = e.account
  FROM ledger_entries e
 WHERE r.account IS NULL AND e.kind = 'refund:' || r.id AND e.account IS NOT NULL;

UPDATE payment_links l SET account = i.account
  FROM invoices i
 WHERE l.invoice_id = i.id AND i.account IS NOT NULL;
UPDATE payment_links l SET account = r.account
  FROM refunds r
 WHERE l.account IS NULL AND l.invoice_id IS NULL AND l.payment_id IN (r.charge_id, r.payment_intent_id) AND r.account IS NOT NULL;

-- A ledger key is (invoice_id, kind, account): two accounts' entries never
-- share one, even when their invoice or refund ids are the same.
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_invoice_id_kind_key;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_key UNIQUE NULLS NOT DISTINCT (invoice_id, kind, account);
DROP INDEX ledger_entries_refund_once;
CREATE UNIQUE INDEX ledger_entries_refund_once
    ON ledger_entries (kind, account) NULLS NOT DISTINCT
    WHERE kind LIKE 'refund:%';
DROP INDEX ledger_entries_refund_reversal_once;
CREATE UNIQUE INDEX ledger_entries_refund_reversal_once
    ON ledger_entries (kind, account) NULLS NOT DISTINCT
    WHERE kind LIKE 'refund\_reversal:%';

-- 2. Disputes (chargebacks), merged from every event that showed them, in
--    any order, as refunds are (internal/handlers/disputes.go):
--      status     the highest-ranked status seen (needs_response,
--                 warning_needs_response < under_review,
--                 warning_under_review < won, lost, prevented,
--                 warning_closed; ties by name); books nothing.
--      withdrawn_amount, withdrawn_currency    set once an event showed the
--                 funds withdrawn (charge.dispute.funds_withdrawn, or
--                 funds_reinstated, which comes only after a withdrawal):
--                 'dispute_funds_withdrawn:<id>'  withdrawn_amount (< 0)
--      reinstated_amount, reinstated_currency  set once an event showed the
--                 funds reinstated (charge.dispute.funds_reinstated):
--                 'dispute_funds_reinstated:<id>' reinstated_amount (> 0)
--    Amounts are the signed balance-transaction amounts when the event
--    carries them, else the dispute's amount; the first event that shows a
--    movement sets it, and it is never changed.
--    booked_under follows refunds: the invoice once any event linked the
--    charge or PaymentIntent (payment_links), else the charge, else the
--    PaymentIntent, else the dispute's own id.
CREATE TABLE disputes (
    id                  text        NOT NULL,             -- dp_... (du_... for older disputes)
    account             text,                             -- acct_... of a connected account; NULL: the platform
    charge_id           text,
    payment_intent_id   text,
    invoice_id          text,                             -- once known; then never changes
    booked_under        text        GENERATED ALWAYS AS (coalesce(invoice_id, charge_id, payment_intent_id, id)) STORED,
    amount              bigint      NOT NULL,             -- the dispute's amount (positive, minor units)
    currency            text,
    status              text        NOT NULL,
    withdrawn_amount    bigint      CHECK (withdrawn_amount < 0),
    withdrawn_currency  text,
    reinstated_amount   bigint      CHECK (reinstated_amount > 0),
    reinstated_currency text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT disputes_id_account UNIQUE NULLS NOT DISTINCT (id, account)
);

CREATE INDEX disputes_charge ON disputes (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX disputes_payment_intent ON disputes (payment_intent_id) WHERE payment_intent_id IS NOT NULL;

-- A dispute's movements are each booked once, whatever key they sit under.
CREATE UNIQUE INDEX ledger_entries_dispute_once
    ON ledger_entries (kind, account) NULLS NOT DISTINCT
    WHERE kind LIKE 'dispute\_%';
