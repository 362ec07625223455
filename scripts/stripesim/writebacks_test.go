package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
)

// The write-back check passes the end state of exactly-once write-backs
// (replays allowed, superseded intents allowed) and fails a doubled, a
// missing, an unsent and a misdirected one.
func TestJudgeWritebacks(t *testing.T) {
	t.Parallel()
	k1, k2, k3 := handlers.CustomerMetadataKey("in_r_1"), handlers.CustomerMetadataKey("in_r_2"), handlers.CustomerMetadataKey("in_r_3")
	payments := map[string]string{"in_r_1": "cus_a", "in_r_2": "cus_b", "in_r_3": "cus_a"}
	good := func() ([]intentRow, []appliedKey) {
		return []intentRow{
				{Key: k1, Target: "cus_a", Status: "done", Via: "superseded", ResultID: "cus_a", Attempts: 2},
				{Key: k2, Target: "cus_b", Status: "done", Via: "call", ResultID: "cus_b", Attempts: 3},
				{Key: k3, Target: "cus_a", Status: "done", Via: "call", ResultID: "cus_a", Attempts: 1},
			}, []appliedKey{
				{Key: k1, Customer: "cus_a", Applied: 1}, // ran before in_r_3's intent was recorded
				{Key: k2, Customer: "cus_b", Applied: 1, Replayed: 2},
				{Key: k3, Customer: "cus_a", Applied: 1},
			}
	}
	intents, applied := good()
	w := judgeWritebacks(payments, intents, applied)
	require.False(t, w.failed(), w.figures())
	require.Equal(t, writebacks{Expected: 3, Intents: 3, Done: 3, Superseded: 1, Reattempted: 2, Applied: 3, Replayed: 2}, w)

	for name, tc := range map[string]struct {
		change func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey)
		want   writebacks // the failure figures only
	}{
		"a second request ran": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			ap[1].Applied = 2
			return in, ap
		}, writebacks{Doubled: 1}},
		"superseded but ran twice": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			ap[0].Applied = 2
			return in, ap
		}, writebacks{Doubled: 1}},
		"recorded as sent, never applied": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			return in, ap[:2]
		}, writebacks{Missing: 1}},
		"no intent for a payment": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			return in[1:], ap
		}, writebacks{Missing: 1}},
		"never sent": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			in[2].Status, in[2].Via, in[2].ResultID = "parked", "", ""
			return in, ap[:2]
		}, writebacks{Unsent: 1}},
		"an intent for no payment": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			k := handlers.CustomerMetadataKey("in_r_9")
			return append(in, intentRow{Key: k, Target: "cus_c", Status: "done", Via: "call", ResultID: "cus_c"}),
				append(ap, appliedKey{Key: k, Customer: "cus_c", Applied: 1})
		}, writebacks{Doubled: 2}},
		"another customer": {func(in []intentRow, ap []appliedKey) ([]intentRow, []appliedKey) {
			ap[2].Customer = "cus_b"
			return in, ap
		}, writebacks{Wrong: 1}},
	} {
		in, ap := tc.change(good())
		w := judgeWritebacks(payments, in, ap)
		require.True(t, w.failed(), name)
		got := writebacks{Missing: w.Missing, Unsent: w.Unsent, Doubled: w.Doubled, Wrong: w.Wrong}
		require.Equal(t, tc.want, got, "%s: %s", name, w.figures())
	}
}

// paidCustomers reads each paid invoice's customer from the events, and
// refuses a paid invoice no event names.
func TestPaidCustomers(t *testing.T) {
	t.Parallel()
	evs := []event{
		{ID: "evt_1", Type: "invoice.paid", Payload: []byte(`{"data":{"object":{"id":"in_1","object":"invoice","customer":"cus_a"}}}`)},
		{ID: "evt_2", Type: "invoice.created", Payload: []byte(`{"data":{"object":{"id":"in_2","object":"invoice","customer":"cus_b"}}}`)},
		{ID: "evt_3", Type: "charge.refunded", Payload: []byte(`{"data":{"object":{"id":"ch_1","object":"charge"}}}`)},
	}
	got, err := paidCustomers(evs, map[string]int64{"in_1": 100})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"in_1": "cus_a"}, got)
	_, err = paidCustomers(evs, map[string]int64{"in_1": 100, "in_3": 5})
	require.ErrorContains(t, err, "in_3")

	// The generator's paid invoices all name their customer.
	gen, exp := generate(rngFor(7), options{seed: 7, invoices: 300, twinRate: 0.05, otherMode: true})
	got, err = paidCustomers(gen, exp.Payments)
	require.NoError(t, err)
	require.Len(t, got, len(exp.Payments))
	require.NotEmpty(t, got)
}
