package handlers

import "strings"

// The statement and arguments of queries.go that scripts/bench hands to
// pgbench, so that the drain's limit runs exactly the SQL invoice.paid runs
// (with pgbench variables in place of the $n parameters). Nothing in the
// application uses these names.
var (
	// PayInvoiceSQL is invoice.paid's one statement in the common case
	// (see payInvoice for its parameters).
	PayInvoiceSQL = payInvoice
	// PaidFrom is the array literal of the states invoice.paid moves an
	// invoice from ($7), and PaidRank the rank of status paid ($9).
	PaidFrom = "{" + strings.Join(fromForPaid, ",") + "}"
	PaidRank = statusRank["paid"]
)
