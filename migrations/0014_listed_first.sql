-- The endpoint's own delivery is the copy that counts (internal/inbox, the
-- webhook's store statement). The reconciler (internal/reconcile) stores an
-- event it lists on Stripe's Events API when the inbox does not have it yet;
-- that copy is rendered in the API version the account had when the event
-- was created, which may not be the endpoint's. When the endpoint's signed
-- delivery of the same event arrives later and the receipt is still
-- unprocessed, the delivery's payload, api_version, source, signature
-- fingerprint and signing time replace the listed copy in the webhook's one
-- INSERT ... ON CONFLICT DO UPDATE, and the worker books the delivery. Once
-- the receipt is processed, a delivery is a duplicate and changes nothing.
--
-- listed_first: the reconciler stored this receipt from the Events API
-- before the endpoint's delivery arrived. Set by the reconciler's INSERT,
-- and kept (set again) when a delivery replaces the listed copy, which also
-- sets source to 'webhook'. So
--   WHERE listed_first                          every event the webhook did not have in time
--   WHERE listed_first AND source = 'webhook'   ... that the endpoint delivered later
--   WHERE source = 'reconcile'                  ... that it never delivered (yet)
-- Receipts the reconciler stored before this migration have listed_first
-- false (they are told by source = 'reconcile' until a delivery replaces
-- them); backfilling them would scan webhook_inbox under this migration's
-- ACCESS EXCLUSIVE lock, and the purge removes them within the retention.
--
-- A constant default: adding the column rewrites nothing, but ALTER TABLE
-- takes an ACCESS EXCLUSIVE lock on webhook_inbox until this file's
-- transaction commits; a deploy that cannot get it within 5s fails and rolls
-- back instead of queueing every webhook insert behind it (deploy again).
SET LOCAL lock_timeout = '5s';

ALTER TABLE webhook_inbox ADD COLUMN listed_first boolean NOT NULL DEFAULT false;

-- The webhook's role may now UPDATE those columns (internal/approle), which
-- a column grant cannot limit to the rows the store statement means. So the
-- table itself says when a receipt's content may change, for every role:
--   - the endpoint's delivery replaces a listed copy: the old row is the
--     reconciler's (source 'reconcile') and unprocessed, the new one is the
--     webhook's with listed_first (inbox.Store);
--   - the purge scrubs a processed receipt: the payload becomes the scrub
--     marker, payload_raw NULL, nothing else of the content changes
--     (internal/inbox purge.go; the marker is inbox.scrubbedPayload);
--   - an UPDATE that names a column without changing it.
-- Anything else is refused as a privilege error (SQLSTATE 42501), so a
-- compromised webhook cannot rewrite a delivered receipt before the worker
-- books it, nor a processed one. The trigger fires only for UPDATEs that set
-- one of these columns: the worker's claims and marks never do.
CREATE FUNCTION webhook_inbox_content_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.source = 'reconcile' AND OLD.processed_at IS NULL
       AND NEW.source = 'webhook' AND NEW.listed_first THEN
        RETURN NEW;
    END IF;
    IF (NEW.api_version, NEW.source, NEW.listed_first, NEW.secret_fingerprint, NEW.signed_at)
       IS NOT DISTINCT FROM (OLD.api_version, OLD.source, OLD.listed_first, OLD.secret_fingerprint, OLD.signed_at) THEN
        IF (NEW.payload, NEW.payload_raw) IS NOT DISTINCT FROM (OLD.payload, OLD.payload_raw) THEN
            RETURN NEW;
        END IF;
        IF OLD.processed_at IS NOT NULL AND NEW.payload = '{"scrubbed": true}'::jsonb AND NEW.payload_raw IS NULL THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'receipt %/%/% (source %, processed %): its content changes only when the endpoint''s delivery replaces a copy the reconciler listed first and the receipt is unprocessed, or when the purge scrubs a processed receipt',
        OLD.provider, OLD.endpoint, OLD.event_id, OLD.source, OLD.processed_at IS NOT NULL
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER webhook_inbox_content_guard
    BEFORE UPDATE OF payload, payload_raw, api_version, source, listed_first, secret_fingerprint, signed_at ON webhook_inbox
    FOR EACH ROW EXECUTE FUNCTION webhook_inbox_content_guard();
