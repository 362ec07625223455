-- Write-backs to Stripe (internal/writeback, docs/writebacks.md): a call to
-- the Stripe API a booking asks for, recorded as an intent in the same
-- transaction as the booking (internal/handlers, invoice.paid), so the
-- booking and its intent commit together or not at all, and sent afterwards
-- by the sender, which records the result here and never calls again for an
-- intent whose result is recorded.
--
--   kind             what to do (customer_metadata: set metadata on a
--                    customer, POST /v1/customers/{target})
--   target           the Stripe object the call changes (cus_...)
--   params           the call's parameters ({"metadata": {...}})
--   idempotency_key  the Idempotency-Key of every attempt: derived from the
--                    kind and the booking's ledger key (invoice, 'payment'),
--                    so a second Event object for the same payment, which
--                    books nothing, cannot record a second intent either
--                    (UNIQUE, and the handler inserts only when it booked)
--                    (at most 240 characters: a retried refusal appends
--                    ':retry<N>', and Stripe takes 255)
--   key_generation   0, or how many times an operator retried the intent
--                    after Stripe refused it (a 4xx, which changed nothing):
--                    Stripe replays a refusal saved under a key, so such a
--                    retry sends under idempotency_key || ':retry<N>'
--   refused          the intent was parked because Stripe refused it (not
--                    because ambiguous failures used up its attempts: then
--                    the call may have run, and a retry keeps the key)
--   event_id         the receipt that booked it (audit)
--   status           pending (the sender tries it), done (its result is
--                    recorded: never called again), parked (Stripe refused
--                    it in a way retrying cannot fix; waits for a human,
--                    inboxctl writeback-retry)
--   attempts         calls made (a 429 gives its attempt back)
--   available_at     when the sender may claim it next (the lease's end while
--                    claimed, the backoff after a failure)
--   first_attempt_at when the first call was made: Stripe may forget an
--                    idempotency key once it is 24 hours old, so an intent
--                    whose first attempt is older is read back before it is
--                    sent again
--   leased_until,    the current claim's lease and fencing token (NULL when
--   claim_token      unclaimed); the sender records an outcome only while
--                    the row carries its claim's token, as the outbox relay
--                    marks (migration 0013)
--   result_id        the id of the object the call changed (or created)
--   result           what Stripe answered (or what the read-back found)
--   result_via       call, read_back (found already in effect after the key
--                    lifetime) or superseded (a newer intent of the same kind
--                    and target was recorded first: sending this one would
--                    undo it)
--   last_error       why the last attempt failed
--
-- A new table: no lock on any existing one.
SET LOCAL lock_timeout = '5s';

CREATE TABLE writeback_intents (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text        NOT NULL CHECK (kind IN ('customer_metadata')),
    target           text        NOT NULL CHECK (target <> ''),
    params           jsonb       NOT NULL CHECK (jsonb_typeof(params) = 'object'),
    idempotency_key  text        NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 240),
    key_generation   integer     NOT NULL DEFAULT 0,
    refused          boolean     NOT NULL DEFAULT false,
    event_id         text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'parked')),
    attempts         integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    last_attempt_at  timestamptz,
    leased_until     timestamptz,
    claim_token      uuid,
    result_id        text,
    result           jsonb,
    result_via       text        CHECK (result_via IN ('call', 'read_back', 'superseded')),
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    done_at          timestamptz,
    CHECK ((status = 'done') = (done_at IS NOT NULL AND result_via IS NOT NULL))
);

-- The sender's claim: pending intents by available_at. Done and parked
-- intents leave the index, so it stays the size of the backlog.
CREATE INDEX writeback_intents_pending
    ON writeback_intents (available_at, id)
    WHERE status = 'pending';

-- Parked intents for inboxctl writebacks and the alarm.
CREATE INDEX writeback_intents_parked
    ON writeback_intents (created_at, id)
    WHERE status = 'parked';

-- The superseded check: the newest recorded intent of a kind and target.
CREATE INDEX writeback_intents_target
    ON writeback_intents (kind, target, id);
