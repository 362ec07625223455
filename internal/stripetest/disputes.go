package stripetest

// Dispute is a dispute of charge (and paymentIntent, "" for null) for
// amount in usd, in status, carrying balanceTransactions (see
// DisputeBalanceTransaction; none: an empty list), on stripe-mock's
// fixture.
func Dispute(id, charge, paymentIntent, status string, amount int64, balanceTransactions ...map[string]any) map[string]any {
	o := Fixture("dispute")
	o["id"], o["charge"], o["status"], o["amount"], o["currency"] = id, charge, status, amount, "usd"
	o["payment_intent"] = nil
	if paymentIntent != "" {
		o["payment_intent"] = paymentIntent
	}
	bts := []any{}
	for _, bt := range balanceTransactions {
		bts = append(bts, bt)
	}
	o["balance_transactions"] = bts
	return o
}

// DisputeBalanceTransaction is a balance transaction of a dispute, on
// stripe-mock's fixture: amount < 0 withdraws the disputed funds (with the
// dispute fee, fee), amount > 0 reinstates them. Its currency is the
// balance's, which can differ from the charge's.
func DisputeBalanceTransaction(id string, amount, fee int64, currency string) map[string]any {
	o := Fixture("balance_transaction")
	category := "dispute"
	if amount > 0 {
		category = "dispute_reversal"
	}
	o["id"], o["amount"], o["fee"], o["net"], o["currency"] = id, amount, fee, amount-fee, currency
	o["reporting_category"], o["type"], o["source"] = category, "adjustment", nil
	o["description"] = "Chargeback withdrawal"
	if amount > 0 {
		o["description"] = "Chargeback reversal"
	}
	return o
}
