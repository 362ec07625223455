package inbox

// The statements of queries.go that scripts/bench hands to pgbench, so that
// the limit each benchmark is measured against runs exactly the SQL the
// webhook and the worker run (with pgbench variables in place of the $n
// parameters). Nothing in the application uses these names.
const (
	StoreSQL                    = storeReceipt             // see storeReceipt for its parameters
	LockSQL                     = lockReceipt              // see lockReceipt
	MarkProcessedSQL            = markProcessed            // see markProcessed
	SetLocalStatementTimeoutSQL = setLocalStatementTimeout // see setLocalStatementTimeout
)

// ClaimSQL is claimReceipts (see it); a variable, as claimReceipts is
// built from lockKey.
var ClaimSQL = claimReceipts
