-- The receipt ledger: one row per (provider, endpoint, event_id), written by the
-- webhook function after the Stripe signature has been verified, and drained by
-- the worker. The primary key is what makes a redelivery a no-op: the webhook
-- inserts with ON CONFLICT DO NOTHING, and a concurrent duplicate waits on the
-- unique index until the first insert commits or rolls back.
CREATE TABLE webhook_inbox (
    -- 'stripe' today; keeps IDs from different providers apart.
    provider     text        NOT NULL CHECK (provider <> ''),
    -- The Stripe endpoint (e.g. 'billing', 'connect'). Each registered endpoint
    -- receives its own copy of an event and must process it on its own.
    endpoint     text        NOT NULL CHECK (endpoint <> ''),
    event_id     text        NOT NULL CHECK (event_id <> ''),
    event_type   text        NOT NULL CHECK (event_type <> ''),
    -- Operator columns, not in the seed design:
    -- api_version: the payload's shape depends on it; an endpoint upgraded in
    --   the Stripe dashboard starts sending a new shape, and an operator needs
    --   to see which receipts carry which version when a handler fails.
    api_version  text,
    -- livemode: a test-mode event must never be mistaken for real money. It is
    --   stored so that it can be filtered in queries and investigations.
    livemode     boolean     NOT NULL,
    -- account: the connected account (acct_...) for Connect events, NULL for
    --   the platform's own events. Lets an operator answer "what did we receive
    --   for this merchant".
    account      text,
    -- object_id: data.object.id. Stripe may send one fact as two Event objects;
    --   (event_type, object_id) is how an operator finds such pairs.
    object_id    text,
    -- The signature-verified event as Stripe sent it (jsonb, so the worker and
    --   operators can query it).
    payload      jsonb       NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    -- When the worker may next claim the row: now() on receipt, the lease end
    -- while claimed, the backoff end after a failure.
    available_at timestamptz NOT NULL DEFAULT now(),
    -- Counted by the claim transaction, before processing, so that a process
    -- that dies while processing still uses up an attempt.
    attempts     integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error   text,
    -- NULL until the business effect has committed (in the same transaction).
    processed_at timestamptz,
    -- How the row was processed ('applied' or 'ignored'); NULL while unprocessed.
    outcome      text        CHECK (outcome IN ('applied', 'ignored')),
    PRIMARY KEY (provider, endpoint, event_id),
    CHECK ((processed_at IS NULL) = (outcome IS NULL))
);

-- The worker's claim scans only unprocessed rows, in available_at order, so
-- the index stays small however much processed history the table keeps.
CREATE INDEX webhook_inbox_unprocessed
    ON webhook_inbox (available_at)
    WHERE processed_at IS NULL;
