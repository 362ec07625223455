-- The outbox relay (internal/outbox) publishes unpublished outbox rows to
-- Amazon EventBridge. It claims rows as the worker claims receipts: a claim
-- counts the attempt, hides the row until leased_until (available_at is set
-- to the same instant) and stamps it with a fresh claim_token, the fencing
-- token: a relay marks a row published only while the row still carries the
-- token of its claim, so one whose lease expired and whose rows another relay
-- claimed since cannot mark them.
--
--   attempts      claims so far (a call that never reached EventBridge, or was
--                 throttled, gives its attempt back)
--   available_at  when the row may be claimed next (now for new rows; the
--                 lease's end while claimed; the backoff after a failure;
--                 'infinity' once it used up its attempts and waits for a
--                 human)
--   leased_until  the end of the current claim's lease (NULL when unclaimed)
--   claim_token   the current claim's fencing token (NULL when unclaimed)
--   last_error    why the last attempt failed
--
-- ADD COLUMN with a constant or stable default (now() is evaluated once,
-- here) does not rewrite the table; the index build takes a SHARE lock that
-- blocks writes to outbox (the worker's handlers) while it runs, which is
-- short: only unpublished rows are indexed. Rows already in the table and
-- unpublished become due now.
SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox
    ADD COLUMN attempts     integer     NOT NULL DEFAULT 0,
    ADD COLUMN available_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN leased_until timestamptz,
    ADD COLUMN claim_token  uuid,
    ADD COLUMN last_error   text;

-- The relay's claim: unpublished rows by available_at. Published rows leave
-- the index (they are never claimed again, and the purge finds them through
-- outbox_published), so it stays the size of the backlog.
CREATE INDEX outbox_unpublished
    ON outbox (available_at, id)
    WHERE published_at IS NULL;
