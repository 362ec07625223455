package main

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// model is the invoice state machine of internal/handlers (queries.go),
// written out here so that the test checks the stories against the documented
// transitions, not against the database.
type model struct {
	status   map[string]string
	payments map[string]int64
	refunds  map[string]int64
	anomaly  int
}

var from = map[string][]string{
	"invoice.created":              nil, // only creates
	"invoice.finalized":            {"draft"},
	"invoice.paid":                 {"draft", "open", "uncollectible"},
	"invoice.voided":               {"draft", "open", "uncollectible"},
	"invoice.marked_uncollectible": {"draft", "open"},
}

func (m *model) apply(t *testing.T, ev event) {
	var env struct {
		Data struct {
			Object struct {
				ID         string `json:"id"`
				AmountPaid int64  `json:"amount_paid"`
				Amount     int64  `json:"amount"`
				Refunds    *struct {
					Data []struct {
						ID     string `json:"id"`
						Amount int64  `json:"amount"`
					} `json:"data"`
				} `json:"refunds"`
			} `json:"object"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(ev.Body, &env))
	obj := env.Data.Object
	switch ev.Type {
	case "refund.created":
		if _, ok := m.refunds[obj.ID]; !ok {
			m.refunds[obj.ID] = -obj.Amount
		}
		return
	case "charge.refunded":
		for _, r := range obj.Refunds.Data {
			if _, ok := m.refunds[r.ID]; !ok {
				m.refunds[r.ID] = -r.Amount
			}
		}
		return
	}
	target := statusAfter[ev.Type]
	cur, ok := m.status[obj.ID]
	if !ok || slices.Contains(from[ev.Type], cur) {
		m.status[obj.ID] = target
	}
	if ev.Type == "invoice.paid" {
		if m.status[obj.ID] != "paid" {
			m.anomaly++
		} else if _, ok := m.payments[obj.ID]; !ok {
			m.payments[obj.ID] = obj.AmountPaid
		}
	}
}

func TestStoriesEndTheSameInAnyOrder(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rngFor(seed)
		sc := generate(rng, runID(seed), 60, 0.1)
		for range 10 {
			ds, _ := plan(rng, sc.Events, 0.1)
			m := &model{status: map[string]string{}, payments: map[string]int64{}, refunds: map[string]int64{}}
			for _, d := range ds {
				for range d.copies {
					m.apply(t, *d.ev)
				}
			}
			require.Zero(t, m.anomaly, "seed %d", seed)
			require.Equal(t, sc.Expected.Payments, m.payments, "seed %d", seed)
			require.Equal(t, sc.Expected.Refunds, m.refunds, "seed %d", seed)
			require.Len(t, m.status, len(sc.Expected.Invoices))
			for id, st := range sc.Expected.Invoices {
				require.Equal(t, st.Status, m.status[id], "seed %d invoice %s", seed, id)
			}
		}
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	t.Parallel()
	a := generate(rngFor(42), runID(42), 100, 0.05)
	b := generate(rngFor(42), runID(42), 100, 0.05)
	require.Equal(t, a.Expected, b.Expected)
	require.Len(t, b.Events, len(a.Events))
	for i := range a.Events {
		require.Equal(t, a.Events[i].ID, b.Events[i].ID)
		require.Equal(t, a.Events[i].Type, b.Events[i].Type)
	}
}

func TestPlanDeliversEveryEvent(t *testing.T) {
	t.Parallel()
	sc := generate(rngFor(7), runID(7), 200, 0.05)
	ds, dups := plan(rngFor(8), sc.Events, 0.1)
	seen := map[string]int{}
	for _, d := range ds {
		seen[d.ev.ID] += d.copies
	}
	require.Len(t, seen, len(sc.Events))
	extra := 0
	for _, n := range seen {
		require.LessOrEqual(t, n, 2)
		extra += n - 1
	}
	require.Equal(t, dups, extra)
	require.InDelta(t, 0.1, float64(dups)/float64(len(sc.Events)), 0.04)
}
