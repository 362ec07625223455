package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The stories and their expected end state are internal/stripetest's
// (tested there against a model of the handlers' rules); the simulator adds
// the delivery plan.

func TestPlanDeliversEveryEvent(t *testing.T) {
	t.Parallel()
	evs, _ := generate(rngFor(7), options{seed: 7, invoices: 200, twinRate: 0.05, otherMode: true})
	ds, dups := plan(rngFor(8), evs, 0.1)
	seen := map[string]int{}
	for _, d := range ds {
		seen[d.ev.ID] += d.copies
	}
	require.Len(t, seen, len(evs))
	extra := 0
	for _, n := range seen {
		require.LessOrEqual(t, n, 2)
		extra += n - 1
	}
	require.Equal(t, dups, extra)
	require.InDelta(t, 0.1, float64(dups)/float64(len(evs)), 0.04)
}
