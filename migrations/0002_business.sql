-- The business tables the invoice handlers update. Each has a business key
-- with a unique constraint, which is what makes the effect happen once even
-- when the same fact arrives as two different Event objects.

CREATE TABLE invoices (
    id          text        PRIMARY KEY,              -- in_...
    customer_id text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('draft', 'open', 'paid', 'void', 'uncollectible')),
    currency    text,
    amount_due  bigint      NOT NULL DEFAULT 0,
    amount_paid bigint      NOT NULL DEFAULT 0,
    paid_at     timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per booked money movement. (invoice_id, kind) is unique so an
-- invoice's payment is booked once; refunds are booked once per refund id.
CREATE TABLE ledger_entries (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    invoice_id  text        NOT NULL,
    kind        text        NOT NULL,                 -- 'payment' or 'refund:re_...'
    amount      bigint      NOT NULL,                 -- minor units; refunds are negative
    currency    text,
    event_id    text        NOT NULL,                 -- the receipt that booked it (audit)
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (invoice_id, kind)
);

-- Downstream notifications, written in the same transaction as the business
-- update (a transactional outbox); a separate dispatcher publishes them.
CREATE TABLE outbox (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz
);
