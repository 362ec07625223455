package handlers

import (
	"context"
	"fmt"
)

// Disputes (chargebacks) are booked when money moves, and only then:
//
//	charge.dispute.funds_withdrawn   'dispute_funds_withdrawn:<id>'   < 0
//	charge.dispute.funds_reinstated  'dispute_funds_reinstated:<id>'  > 0 (and the withdrawal, if not yet booked)
//	charge.dispute.created, .updated, .closed: the status, nothing booked
//
// Each event is an observation merged into the dispute's row (disputes,
// migrations/0017) in a way that does not depend on order, as refunds are
// (refunds.go): the highest-ranked status, the first amount shown for each
// movement; the ledger entries are a function of the row. A reinstatement
// comes only after a withdrawal (https://docs.stripe.com/disputes/how-disputes-work:
// the disputed amount is withdrawn when the dispute opens and returned if
// it is won), so a funds_reinstated processed first books both movements,
// and the withdrawal's own event later books nothing new. Two Event objects
// for one movement book it once (the entries' unique key: kind and
// account).
//
// The amounts: the dispute's balance_transactions, when the event carries
// them (stripe-go v82 Dispute.BalanceTransactions: "List of zero, one, or two
// balance transactions that show funds withdrawn and reinstated to your
// Stripe account as a result of this dispute"): the withdrawal is the one
// with a negative amount, the reinstatement the one with a positive amount,
// each booked in its own amount and currency (the balance's, which can
// differ from the charge's). When the event carries no such balance
// transaction, the dispute's amount and currency. The balance
// transactions' fee (the dispute fee) is not booked (docs/events.md).
//
// Attribution: as a refund's, through payment_links: the invoice of its
// charge or PaymentIntent when an event has linked it, else the charge, else
// the PaymentIntent; a later link moves the entries to the invoice
// (attributeRefunds moves them with the refunds). Each entry newly booked
// queues one outbox row (DisputeFundsWithdrawn, DisputeFundsReinstated).

// dispute is the part of a Stripe Dispute the handlers read; contract says
// how. The fields are the same in every version the handlers know
// (releases.go); 2025-08-27.basil added the status prevented.
type dispute struct {
	ID                  Str                  `json:"id"`
	Amount              Int                  `json:"amount"`
	Currency            Str                  `json:"currency"`
	Charge              ID                   `json:"charge"`         // an id or an expanded Charge
	PaymentIntent       ID                   `json:"payment_intent"` // an id, an expanded PaymentIntent, or null
	Status              Str                  `json:"status"`
	BalanceTransactions []balanceTransaction `json:"balance_transactions"`
}

// balanceTransaction is the part of a BalanceTransaction the handlers read.
type balanceTransaction struct {
	ID       Str `json:"id"`
	Amount   Int `json:"amount"` // signed: < 0 withdrawn, > 0 reinstated
	Currency Str `json:"currency"`
}

// disputeStatuses are the statuses Stripe documents for a dispute
// (stripe-go v82 DisputeStatus; prevented since 2025-08-27.basil, stripe-go
// 82.5.1 and 83.0.0).
var disputeStatuses = []string{"warning_needs_response", "warning_under_review", "warning_closed",
	"needs_response", "under_review", "won", "lost", "prevented"}

func (d *dispute) contract(c *checker) {
	c.want("id", d.ID.Kind, String)
	c.nonEmpty("id", d.ID.Kind, d.ID.V)
	c.want("amount", d.Amount.Kind, Integer)
	c.positive("amount", d.Amount)
	c.want("currency", d.Currency.Kind, String)
	c.want("charge", d.Charge.Kind, Ref)
	c.nonEmpty("charge", d.Charge.Kind, d.Charge.V)
	c.want("payment_intent", d.PaymentIntent.Kind, Ref|Null|Absent)
	c.want("status", d.Status.Kind, String)
	c.oneOf("status", d.Status, disputeStatuses...)
	var withdrawals, reinstatements int
	for i := range d.BalanceTransactions {
		bt := &d.BalanceTransactions[i]
		c.in(fmt.Sprintf("balance_transactions[%d]", i), func(c *checker) {
			c.want("id", bt.ID.Kind, String)
			c.want("amount", bt.Amount.Kind, Integer)
			c.want("currency", bt.Currency.Kind, String)
		})
		switch {
		case bt.Amount.V < 0:
			withdrawals++
		case bt.Amount.V > 0:
			reinstatements++
		}
	}
	if c.bad == nil && (withdrawals > 1 || reinstatements > 1) {
		c.bad = &ContractError{Field: c.path("balance_transactions"), Want: "at most one withdrawal (amount < 0) and one reinstatement (amount > 0)",
			Got: fmt.Sprintf("%d withdrawals and %d reinstatements", withdrawals, reinstatements)}
	}
}

// movement is one booked dispute movement: a signed amount and its currency.
type movement struct {
	amount   *int64
	currency *string
}

// movement returns the movement of sign (-1 withdrawn, +1 reinstated): the
// balance transaction of that sign when the event carries one, else the
// dispute's amount and currency.
func (d dispute) movement(sign int64) movement {
	for _, bt := range d.BalanceTransactions {
		if bt.Amount.V*sign > 0 {
			a, cur := bt.Amount.V, bt.Currency.V
			return movement{&a, &cur}
		}
	}
	a := sign * d.Amount.V
	return movement{&a, nullIfEmpty(d.Currency.V)}
}

// disputeChanged records the dispute's status (created, updated, closed)
// and books the movements the event shows: funds_withdrawn the withdrawal,
// funds_reinstated the reinstatement and the withdrawal before it.
func disputeChanged(ctx context.Context, tx DB, ev Event, d dispute, _ Meta) (Result, error) {
	var withdrawn, reinstated movement
	switch ev.Type {
	case "charge.dispute.funds_reinstated":
		reinstated = d.movement(+1)
		withdrawn = d.movement(-1)
	case "charge.dispute.funds_withdrawn":
		withdrawn = d.movement(-1)
	}
	ch, pi := d.Charge.V, d.PaymentIntent.V
	if _, err := tx.Exec(ctx, applyDispute, d.ID.V, nullIfEmpty(ch), nullIfEmpty(pi), d.Amount.V, nullIfEmpty(d.Currency.V), d.Status.V, ev.ID,
		paymentIDs(ch, pi), account(ev), withdrawn.amount, withdrawn.currency, reinstated.amount, reinstated.currency); err != nil {
		return Result{}, fmt.Errorf("applying dispute %s (%s): %w", d.ID.V, ev.Type, err)
	}
	return Result{Outcome: Applied}, nil
}
