-- The operator path traceable to a person (issue 29): who made each change,
-- as AWS verified it, and which rows it touched.
--
-- principal_arn: the caller's IAM identity as STS verified it
--   (sts:GetCallerIdentity of the presigned request inboxctl sends, see
--   internal/invokeproof): arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION
--   or arn:aws:iam::ACCOUNT:user/NAME. NULL for a local run (DATABASE_URL:
--   whoever holds the database's credentials) and for rows written before
--   this migration.
-- principal_id: STS's unique id of the same principal (AROA...:SESSION).
-- claimed_actor: the name the caller gave (inboxctl sends the local user
--   name, INBOXCTL_ACTOR). Nothing checks it; it sits beside the verified
--   identity, never in its place.
-- touched: the keys of the rows the change touched, by table:
--   {"webhook_inbox": [["billing", "evt_1"], ...]}, {"anomalies": [12]},
--   {"outbox": [3, 4]}. NULL for rows written before this migration.
--
-- actor keeps its meaning for reading one column: the verified ARN when
-- there is one, else the local user's name.
--
-- Nullable, no default: adding them rewrites nothing. The ACCESS EXCLUSIVE
-- lock is on ops_audit only (operators' changes wait, nothing else does).
SET LOCAL lock_timeout = '5s';

ALTER TABLE ops_audit
    ADD COLUMN principal_arn text CHECK (principal_arn LIKE 'arn:%'),
    ADD COLUMN principal_id  text,
    ADD COLUMN claimed_actor text,
    ADD COLUMN touched       jsonb CHECK (jsonb_typeof(touched) = 'object');

COMMENT ON COLUMN ops_audit.principal_arn IS 'caller''s IAM identity as STS verified it; NULL for a local run';
COMMENT ON COLUMN ops_audit.claimed_actor IS 'the name the caller gave; not verified';
COMMENT ON COLUMN ops_audit.touched IS 'keys of the rows the change touched, by table';
