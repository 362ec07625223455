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
	ds, n := plan(rngFor(8), evs, 0.1, paths{})
	dups := n.dups
	require.Zero(t, n.eb)
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

// With EventBridge, about half the events go by each path, and most
// duplicates go one copy by each, some as a concurrent pair.
func TestPlanSplitsPaths(t *testing.T) {
	t.Parallel()
	evs, _ := generate(rngFor(7), options{seed: 7, invoices: 200, twinRate: 0.05, otherMode: true})
	ds, n := plan(rngFor(8), evs, 0.2, paths{ebShare: 0.5, crossShare: 0.75})
	byID := map[string][]bool{}
	eb, concurrentCross := 0, 0
	for _, d := range ds {
		for c := range d.copies {
			byID[d.ev.ID] = append(byID[d.ev.ID], d.via[c])
			if d.via[c] {
				eb++
			}
		}
		if d.copies == 2 && d.via[0] != d.via[1] {
			concurrentCross++
		}
	}
	require.Len(t, byID, len(evs))
	cross := 0
	for _, via := range byID {
		if len(via) == 2 && via[0] != via[1] {
			cross++
		}
	}
	require.Equal(t, n.eb, eb)
	require.Equal(t, n.cross, cross)
	require.Positive(t, concurrentCross)
	require.InDelta(t, 0.5, float64(eb)/float64(len(evs)+n.dups), 0.06)
	require.InDelta(t, 0.75, float64(cross)/float64(n.dups), 0.12)
}
