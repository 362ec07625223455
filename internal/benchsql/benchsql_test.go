package benchsql_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/benchsql"
)

// TestStatementsAreTheApplications: each captured statement is the one its
// function runs (the capture itself panics at init when a function no
// longer starts with one statement), with the arguments the bench copies.
func TestStatementsAreTheApplications(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ sql, contains string }{
		"store":              {benchsql.StoreSQL, "INSERT INTO webhook_inbox"},
		"claim":              {benchsql.ClaimSQL, "FOR UPDATE SKIP LOCKED"},
		"statement timeout":  {benchsql.SetLocalStatementTimeoutSQL, "set_config('statement_timeout'"},
		"lock":               {benchsql.LockSQL, "FOR UPDATE"},
		"mark processed":     {benchsql.MarkProcessedSQL, "processed_at"},
		"invoice.paid":       {benchsql.PayInvoiceSQL, "INSERT INTO outbox"},
		"invoice.paid books": {benchsql.PayInvoiceSQL, "INSERT INTO ledger_entries"},
	} {
		require.Contains(t, tc.sql, tc.contains, name)
	}
	require.Equal(t, "{draft,open,uncollectible}", benchsql.PaidFrom)
	require.Equal(t, 4, benchsql.PaidRank) // paid outranks void (issue 23)
}

// TestProductionNeverImportsIt: no function or command depends on this
// package; only the bench (scripts/bench) and tests do.
func TestProductionNeverImportsIt(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "list", "-deps", "./functions/...", "./cmd/...", "./infra/...")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.NotContains(t, string(out), "internal/benchsql")
	require.Contains(t, string(out), "internal/inbox", "the listing covers the functions")
}
