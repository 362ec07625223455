-- A signature-verified event whose text PostgreSQL's jsonb refuses is still a
-- receipt we owe Stripe: an escaped \u0000 or a lone surrogate escape
-- ("\ud800") in customer text is valid JSON that Go decodes, but jsonb cannot
-- hold it. Refusing such an event (4xx) loses it after Stripe's retries, and
-- failing its INSERT (5xx) loses it the same way.
--
-- payload_raw holds the exact bytes Stripe signed, and only for those events:
-- NULL for every other receipt, whose payload column holds the event as
-- before. When it is set, payload holds a lossy but valid rendering of the
-- same event (each character jsonb refuses replaced by U+FFFD, or, for a
-- refusal we cannot mend, a marker with the id and type), so an operator's
-- queries on payload keep working for every receipt, and the worker reads
-- payload_raw (internal/inbox/queries.go). Keeping the raw bytes for every
-- receipt instead would double the table's size for a case Stripe's own
-- events almost never hit.
--
-- Operators find such receipts with: WHERE payload_raw IS NOT NULL.
-- The purge's payload scrubbing clears payload_raw with payload.
--
-- A nullable column without a default: adding it rewrites nothing, but it
-- still takes an ACCESS EXCLUSIVE lock on webhook_inbox, held until this
-- migration's transaction commits (the runner applies each file in one
-- transaction), and while it waits for that lock every webhook insert queues
-- behind it. So a deploy that cannot get it within 5s (a long query holds the
-- table) fails and rolls back instead; deploy again when the query is gone.
SET LOCAL lock_timeout = '5s';

ALTER TABLE webhook_inbox ADD COLUMN payload_raw bytea;
