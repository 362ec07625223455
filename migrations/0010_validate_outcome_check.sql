-- Validate the outcome check that 0005 added NOT VALID. In a transaction of
-- its own, VALIDATE CONSTRAINT scans webhook_inbox under a SHARE UPDATE
-- EXCLUSIVE lock, which does not block the webhook's inserts or the worker's
-- updates (0005 held ACCESS EXCLUSIVE only for the DROP and ADD).
SET LOCAL lock_timeout = '5s';

ALTER TABLE webhook_inbox VALIDATE CONSTRAINT webhook_inbox_outcome_check;
