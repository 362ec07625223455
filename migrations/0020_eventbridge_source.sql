-- Stripe's events also arrive through Amazon EventBridge (issue 26,
-- internal/ingest): an event destination of type amazon_eventbridge puts
-- each event on a partner event bus, a rule hands it to an SQS queue, and
-- the ingest function stores it with the webhook's one store statement
-- (internal/inbox, storeDelivery) under source 'eventbridge'. An EventBridge
-- delivery is the endpoint's own delivery, as the webhook's is: rendered
-- in the destination's pinned API version, so it replaces a copy the
-- reconciler listed first while the receipt is unprocessed, exactly as the
-- webhook's does, and anything else is a duplicate. So one event is one
-- receipt whichever path brings it first, or both at once.
--
-- The check is replaced NOT VALID (no scan under the ACCESS EXCLUSIVE
-- lock; every existing row satisfies the new, wider check), and the
-- content guard of 0014 admits the EventBridge delivery where it admitted
-- the webhook's.
SET LOCAL lock_timeout = '5s';

ALTER TABLE webhook_inbox DROP CONSTRAINT webhook_inbox_source_check;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_source_check
    CHECK (source IN ('webhook', 'reconcile', 'eventbridge')) NOT VALID;

CREATE OR REPLACE FUNCTION webhook_inbox_content_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.source = 'reconcile' AND OLD.processed_at IS NULL
       AND NEW.source IN ('webhook', 'eventbridge') AND NEW.listed_first THEN
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
    RAISE EXCEPTION 'receipt %/%/% (source %, processed %): its content changes only when the endpoint''s delivery (webhook or EventBridge) replaces a copy the reconciler listed first and the receipt is unprocessed, or when the purge scrubs a processed receipt',
        OLD.provider, OLD.endpoint, OLD.event_id, OLD.source, OLD.processed_at IS NOT NULL
        USING ERRCODE = 'insufficient_privilege';
END
$$;
