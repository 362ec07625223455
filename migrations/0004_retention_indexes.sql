-- Indexes for the scheduled purge (internal/retention, functions/purge).
--
-- The purge deletes, in short batches, the oldest processed receipts and the
-- oldest published outbox rows past the retention:
--
--   DELETE FROM webhook_inbox WHERE ctid = ANY (ARRAY(
--       SELECT ctid FROM webhook_inbox
--        WHERE processed_at IS NOT NULL AND processed_at < $cutoff
--        ORDER BY processed_at LIMIT $n FOR UPDATE SKIP LOCKED))
--
-- Without an index on the timestamp, every batch would scan the whole table
-- (all of the retained history plus the unprocessed rows) to find n rows, and
-- a daily run of many batches would read the table many times over. With
-- these indexes each batch is a short index range scan from the oldest entry
-- that stops after n rows, so a batch's cost and the time it holds its row
-- locks depend on the batch size, not on the table's size.
--
-- They are partial: an unprocessed receipt or an unpublished outbox row is
-- never a purge candidate, so it is left out of the index. That keeps the
-- index off the hot insert path (the webhook inserts receipts with
-- processed_at NULL, the handlers insert outbox rows with published_at NULL:
-- neither insert touches these indexes) and means the purge cannot pick such
-- a row even through a planner mistake of ours.
--
-- The migration runner applies each file in a transaction, so these cannot be
-- CREATE INDEX CONCURRENTLY; the build takes a SHARE lock that blocks writes
-- to each table while it runs. That is short while the tables are small (the
-- system is new, and the purge keeps them bounded from now on).
CREATE INDEX webhook_inbox_processed
    ON webhook_inbox (processed_at)
    WHERE processed_at IS NOT NULL;

CREATE INDEX outbox_published
    ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Payload scrubbing (SCRUB_PAYLOAD_AFTER_DAYS, off by default) replaces the
-- payload of processed receipts past the scrub window with a marker and keeps
-- the row. Its batches look for processed rows that are not scrubbed yet.
-- Through webhook_inbox_processed alone, every batch would first walk past
-- all the rows scrubbed on earlier days (they are the oldest, and stay until
-- the retention deletes them), reading each one's payload; this index holds
-- only the rows still to scrub, and a row leaves it when it is scrubbed. The
-- predicate must match the scrub query in internal/retention/queries.go
-- exactly (same marker literal), or the planner cannot use it. It costs one
-- small entry per processed receipt, dropped when the row is scrubbed or
-- deleted.
CREATE INDEX webhook_inbox_unscrubbed
    ON webhook_inbox (processed_at)
    WHERE processed_at IS NOT NULL AND payload <> '{"scrubbed": true}'::jsonb;
