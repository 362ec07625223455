-- The claim's owners (issue 24; internal/inbox/queries.go, claimReceipts
-- and ownerKey).
--
-- A claim takes, with the receipts it picks, the other claimable receipts
-- of the same owner: the invoice a receipt belongs to as far as its payload
-- tells (the event's invoice, the object's invoice or charge field, else the
-- object, else the event). So one drainer gets all the waiting events of
-- the invoices it takes, and concurrent batches stop waiting on each other's
-- locks. It finds them through this index.
--
-- The expression is ownerKey's, character for character: PostgreSQL uses an
-- expression index only for a query with the same expression
-- (TestOwnerKeyIsTheIndexExpression compares them). Every function in it
-- is immutable (jsonb_typeof, #>, #>>, ->>, nullif, coalesce, LIKE), as an
-- index expression must be. Nothing is stored in the table: the webhook's
-- INSERT and its role's grants are unchanged; the index is maintained on
-- insert, from the payload the receipt carries.
--
-- Partial, as webhook_inbox_unprocessed: only unprocessed receipts are ever
-- claimed, so the index holds the backlog, not the history, and a receipt
-- leaves it when it is processed. The migration runner applies each file in
-- a transaction, so this is not CREATE INDEX CONCURRENTLY: the build takes
-- a SHARE lock that blocks writes to webhook_inbox while it runs, which
-- reads the table once and indexes only its unprocessed rows.
CREATE INDEX webhook_inbox_owner
    ON webhook_inbox ((CASE WHEN object_id LIKE 'in\_%' THEN object_id
      ELSE coalesce(nullif(CASE jsonb_typeof(payload #> '{data,object,invoice}') WHEN 'string' THEN payload #> '{data,object,invoice}' #>> '{}' WHEN 'object' THEN payload #> '{data,object,invoice}' ->> 'id' END, ''),
                    nullif(CASE jsonb_typeof(payload #> '{data,object,charge}') WHEN 'string' THEN payload #> '{data,object,charge}' #>> '{}' WHEN 'object' THEN payload #> '{data,object,charge}' ->> 'id' END, ''),
                    object_id, event_id) END))
    WHERE processed_at IS NULL;
