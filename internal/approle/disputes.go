package approle

// workerDisputeGrants are the worker's privileges on the disputes table
// (migrations/0017_disputes_accounts.sql), exactly what its statements
// need (internal/handlers: applyDispute, attributeRefunds, which moves
// disputes with refunds, and the unattributed check of linkPayments and
// payInvoice), and no DELETE:
//
//   - INSERT of the columns applyDispute inserts;
//   - UPDATE of the columns its ON CONFLICT DO UPDATE merges and
//     attributeRefunds sets (never amount: a dispute's amount, and each
//     movement's once known, never change);
//   - SELECT of the columns the statements read: the conflict key
//     (id, account), the row's merge inputs, what disputeEntries books from
//     (booked_under and the movements), and the attribution's filter.
//
// They are part of workerGrants, which TestWorkerRoleRunsExactlyItsStatements
// checks in both directions (each grant used, nothing else allowed).
func workerDisputeGrants(worker string) []string {
	return []string{
		"GRANT INSERT (id, account, charge_id, payment_intent_id, invoice_id, amount, currency, status, " +
			"withdrawn_amount, withdrawn_currency, reinstated_amount, reinstated_currency) ON public.disputes TO " + worker,
		"GRANT UPDATE (status, charge_id, payment_intent_id, invoice_id, currency, withdrawn_amount, withdrawn_currency, " +
			"reinstated_amount, reinstated_currency, updated_at) ON public.disputes TO " + worker,
		"GRANT SELECT (id, account, charge_id, payment_intent_id, invoice_id, booked_under, currency, status, " +
			"withdrawn_amount, withdrawn_currency, reinstated_amount, reinstated_currency) ON public.disputes TO " + worker,
	}
}
