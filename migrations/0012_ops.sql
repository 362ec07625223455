-- Operating without SQL (issue 16): the operator command inboxctl and the
-- stack's ops function (internal/ops).
--
-- 1. ops_audit: every mutating operator call (retry, resolve) writes one row
--    in the same transaction as its change, so the trail and the change
--    commit together or not at all. Rows are only ever inserted.
CREATE TABLE ops_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- What was done: 'retry' or 'resolve'.
    action     text        NOT NULL CHECK (action <> ''),
    -- The arguments that selected the rows (event id, filters, anomaly id),
    -- as the command received them.
    filter     jsonb       NOT NULL,
    -- How many rows the change touched.
    affected   integer     NOT NULL CHECK (affected >= 0),
    -- Why (--reason, --note): required, never empty.
    reason     text        NOT NULL CHECK (reason <> ''),
    -- Who: the local OS user for a local run; for the ops function the
    --   caller's identity as Lambda reports it, else 'lambda'.
    actor      text        NOT NULL CHECK (actor <> ''),
    -- The Lambda request id of the ops function's invocation (NULL locally),
    --   to find the call in CloudTrail and the function's log.
    request_id text,
    at         timestamptz NOT NULL DEFAULT now()
);

-- 2. Receipt columns for inboxctl secrets, status and the webhook.
--    secret_fingerprint: the first 8 bytes of SHA-256 of the signing secret
--      that verified the delivery, in hex (never the secret), so an operator
--      sees when the old secret of a roll stopped matching.
--    signed_at: the Stripe-Signature timestamp (t=) of the stored delivery.
--    duplicates: how many later deliveries of the same event the webhook
--      answered "duplicate" (a duplicate share that spikes means Stripe did
--      not get our answers in time and retried).
--    All three are written by the webhook. Nullable or with a constant
--    default: adding them rewrites nothing, but ALTER TABLE takes an ACCESS
--    EXCLUSIVE lock on webhook_inbox until this file's transaction commits;
--    a deploy that cannot get it within 5s fails and rolls back instead of
--    queueing every webhook insert behind it (deploy again).
SET LOCAL lock_timeout = '5s';

ALTER TABLE webhook_inbox
    ADD COLUMN secret_fingerprint text,
    ADD COLUMN signed_at          timestamptz,
    ADD COLUMN duplicates         integer NOT NULL DEFAULT 0;
