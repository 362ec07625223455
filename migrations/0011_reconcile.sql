-- Reconciliation against Stripe's Events API (internal/reconcile).
--
-- source: who stored the receipt. 'webhook' (Stripe delivered it) or
-- 'reconcile' (the reconciler found it on GET /v1/events and Stripe had not
-- delivered it, or not yet). Both store with the same INSERT ... ON CONFLICT
-- DO NOTHING on (provider, endpoint, event_id), so whichever comes second is
-- a duplicate and the column keeps the first. A receipt with source
-- 'reconcile' is an event the webhook missed: the reconciler counts them
-- (metric EventsFoundMissing) and an operator lists them with
--   SELECT event_type, count(*) FROM webhook_inbox WHERE source = 'reconcile' GROUP BY 1;
--
-- ADD COLUMN with a constant default does not rewrite the table (PostgreSQL
-- 11+ stores the default in the catalog). The check is added NOT VALID so
-- that it does not scan the table under this migration's ACCESS EXCLUSIVE
-- lock: every existing row has the default 'webhook', which satisfies it,
-- and new rows are checked.
SET LOCAL lock_timeout = '5s';

ALTER TABLE webhook_inbox ADD COLUMN source text NOT NULL DEFAULT 'webhook';
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_source_check
    CHECK (source IN ('webhook', 'reconcile')) NOT VALID;

-- The reconciler's high-water mark, one per (provider, endpoint): every event
-- created before it has been listed and stored. It only advances after a
-- whole window up to it has been stored (internal/reconcile), so a failed
-- page leaves it where it was and the next run lists the window again.
CREATE TABLE reconcile_high_water (
    provider   text        NOT NULL CHECK (provider <> ''),
    endpoint   text        NOT NULL CHECK (endpoint <> ''),
    high_water timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, endpoint)
);
