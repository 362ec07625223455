package worker

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/inbox"
)

// TestRefundsOfUnlinkedChargesLeaveTheBatch: a refund event whose invoice
// the claim could not tell (LockKey is its charge) is applied after the
// batch, in a transaction of the batch's unplaced refunds; everything else,
// refunds whose invoice is known included, keeps its place in the invoice
// order. (The drain figures in
// scripts/bench show what this is for: with refunds in the batch, 4
// drainers deadlocked again and again.)
func TestRefundsOfUnlinkedChargesLeaveTheBatch(t *testing.T) {
	claimed := []inbox.Claimed{
		{Key: inbox.Key{EventID: "e0"}, EventType: "invoice.paid", LockKey: "in_1"},
		{Key: inbox.Key{EventID: "e1"}, EventType: "refund.created", LockKey: "ch_2"},
		{Key: inbox.Key{EventID: "e2"}, EventType: "refund.updated", LockKey: "in_3"},
		{Key: inbox.Key{EventID: "e3"}, EventType: "charge.refunded", LockKey: "ch_4"},
		{Key: inbox.Key{EventID: "e4"}, EventType: "charge.refund.updated", LockKey: "pi_5"},
		{Key: inbox.Key{EventID: "e5"}, EventType: "customer.updated", LockKey: "cus_6"},
		{Key: inbox.Key{EventID: "e6"}, EventType: "refund.failed", LockKey: "re_7"},
	}
	batched, alone := splitUnplaced(claimed, []int{0, 1, 2, 3, 4, 5, 6})
	require.Equal(t, []int{0, 2, 5}, batched)
	require.Equal(t, []int{1, 3, 4, 6}, alone)
}
