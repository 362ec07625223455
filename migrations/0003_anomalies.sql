-- Business facts that contradict each other and that no handler may resolve
-- on its own, e.g. a payment reported for an invoice that is already void.
-- Nothing is booked for them; an operator lists the unresolved rows (the
-- worker reports their count as the AnomalyCount metric, which alarms), looks
-- at the Stripe dashboard, and sets resolved_at with a note.
CREATE TABLE anomalies (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text        NOT NULL,                 -- e.g. 'payment_on_void_invoice'
    subject_id  text        NOT NULL,                 -- the business object, e.g. in_...
    endpoint    text        NOT NULL,
    event_id    text        NOT NULL,                 -- the first receipt that raised it
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    resolution  text,
    -- One anomaly per fact: the same payment arriving again (redelivery, or a
    -- second Event object) does not raise a second row.
    UNIQUE (kind, subject_id)
);

CREATE INDEX anomalies_unresolved ON anomalies (created_at) WHERE resolved_at IS NULL;

-- A refund is identified by its own id (re_...), whatever invoice or charge it
-- is booked against: it must never be booked twice, even if two events name
-- it under different invoices (API versions differ in what a charge carries).
CREATE UNIQUE INDEX ledger_entries_refund_once
    ON ledger_entries (kind)
    WHERE kind LIKE 'refund:%';
