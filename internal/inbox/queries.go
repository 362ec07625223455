package inbox

// Every statement that touches webhook_inbox. Parameters are positional
// because pgx's exec mode (no prepared-statement cache, see
// internal/database) sends them as-is; each query documents its parameters.

// storeReceipt: $1 provider, $2 endpoint, $3 event_id, $4 event_type,
// $5 api_version, $6 livemode, $7 account, $8 object_id, $9 payload (text).
// Returns one row when the receipt is new, none when it is a duplicate.
const storeReceipt = `
INSERT INTO webhook_inbox
    (provider, endpoint, event_id, event_type, api_version, livemode, account, object_id, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)
ON CONFLICT (provider, endpoint, event_id) DO NOTHING
RETURNING true`
