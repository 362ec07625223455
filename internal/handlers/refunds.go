package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// refund is the part of a Stripe Refund the handlers read.
type refund struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Charge   any    `json:"charge"` // an id, or an expanded Charge
}

// charge is the part of a Stripe Charge the handlers read.
type charge struct {
	ID       string `json:"id"`
	Invoice  any    `json:"invoice"` // an id, an expanded Invoice, or absent (newer API versions)
	Currency string `json:"currency"`
	Refunds  *struct {
		Data []refund `json:"data"`
	} `json:"refunds"`
}

// idOf returns the id of a field that is either an id string or an expanded
// object with an id.
func idOf(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		if id, ok := x["id"].(string); ok {
			return id
		}
	}
	return ""
}

// charge.refunded: book each refund in the charge's refund list once, keyed
// by the refund id, as a negative entry against the charge's invoice (or the
// charge itself when it has no invoice).
//
// Since API version 2022-11-15 a charge no longer carries its refunds unless
// expanded. Such an event books nothing here; subscribe the endpoint to
// refund.created as well, which carries each refund (see README).
func chargeRefunded(ctx context.Context, tx DB, ev Event) (Result, error) {
	var env struct {
		Data struct {
			Object charge `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	ch := env.Data.Object
	if ch.ID == "" {
		return Result{}, fmt.Errorf("%w: data.object.id", ErrBadPayload)
	}
	if ch.Refunds == nil {
		return Result{Outcome: Applied}, nil
	}
	subject := idOf(ch.Invoice)
	if subject == "" {
		subject = ch.ID
	}
	// In id order, so that two events listing the same refunds lock them in
	// the same order.
	refunds := slices.SortedFunc(slices.Values(ch.Refunds.Data), func(a, b refund) int { return strings.Compare(a.ID, b.ID) })
	for _, r := range refunds {
		if r.ID == "" {
			return Result{}, fmt.Errorf("%w: a refund without id in charge %s", ErrBadPayload, ch.ID)
		}
		currency := r.Currency
		if currency == "" {
			currency = ch.Currency
		}
		if _, err := book(ctx, tx, subject, "refund:"+r.ID, -r.Amount, currency, ev.ID); err != nil {
			return Result{}, err
		}
	}
	return Result{Outcome: Applied}, nil
}

// refund.created: book the refund once, keyed by its id, against its charge.
// The ledger's unique index on refund kinds makes this and charge.refunded
// book a refund once between them.
func refundCreated(ctx context.Context, tx DB, ev Event) (Result, error) {
	var env struct {
		Data struct {
			Object refund `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	r := env.Data.Object
	if r.ID == "" {
		return Result{}, fmt.Errorf("%w: data.object.id", ErrBadPayload)
	}
	subject := idOf(r.Charge)
	if subject == "" {
		subject = r.ID
	}
	_, err := book(ctx, tx, subject, "refund:"+r.ID, -r.Amount, r.Currency, ev.ID)
	return Result{Outcome: Applied}, err
}
