package stripetest_test

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// model is the documented behaviour of internal/handlers (the transitions in
// queries.go, the refund rules in refunds.go, the dispute rules in
// disputes.go, the out-of-band rule in invoices.go), written out here so that the
// generator's Expect is checked against the rules, not against the
// database: the stories must end in Expect in any order of their events,
// however often each arrives.
type model struct {
	livemode bool
	invoices map[string]*modelInvoice
	links    map[string]string // charge or PaymentIntent -> invoice
	refunds  map[string]*modelRefund
	disputes map[string]*modelDispute
	ledger   map[stripetest.LedgerKey]int64
	payments map[string]int64
	oob      map[string]bool // invoices paid outside Stripe
	// anomalies are the invoices both paid and voided (one
	// payment_on_void_invoice each, whichever came first).
	anomalies map[string]bool
}

// modelDispute: the highest-ranked status; a movement's amount is the
// first one shown.
type modelDispute struct {
	charge                string
	status                string
	withdrawn, reinstated *int64
}

type modelInvoice struct {
	status     string
	amountPaid int64
	snapshot   [2]int64 // created, status rank
	snapshotID string
	amountDue  int64
}

type modelRefund struct {
	charge, pi string
	amount     int64
	status     string
	succeeded  bool
}

var (
	from = map[string][]string{
		"draft":         nil, // only creates
		"open":          {"draft"},
		"paid":          {"draft", "open", "uncollectible"},
		"void":          {"draft", "open", "uncollectible"},
		"uncollectible": {"draft", "open"},
	}
	target = map[string]string{
		"invoice.created": "draft", "invoice.finalized": "open", "invoice.paid": "paid",
		"invoice.voided": "void", "invoice.marked_uncollectible": "uncollectible",
	}
	statusRank = map[string]int64{"draft": 0, "open": 1, "uncollectible": 2, "void": 3, "paid": 4}
	refundRank = map[string]int{"pending": 0, "requires_action": 0, "succeeded": 1, "failed": 2, "canceled": 2}
)

func newModel(livemode bool) *model {
	return &model{livemode: livemode, invoices: map[string]*modelInvoice{}, links: map[string]string{},
		refunds: map[string]*modelRefund{}, disputes: map[string]*modelDispute{}, ledger: map[stripetest.LedgerKey]int64{},
		payments: map[string]int64{}, oob: map[string]bool{}, anomalies: map[string]bool{}}
}

type object struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	AmountDue     int64  `json:"amount_due"`
	AmountPaid    int64  `json:"amount_paid"`
	Amount        int64  `json:"amount"`
	Charge        string `json:"charge"`
	PaymentIntent string `json:"payment_intent"`
	Invoice       string `json:"invoice"`
	PaidOutOfBand bool   `json:"paid_out_of_band"`
	Payment       struct {
		Charge        string `json:"charge"`
		PaymentIntent string `json:"payment_intent"`
	} `json:"payment"`
	BalanceTransactions []struct {
		Amount int64 `json:"amount"`
	} `json:"balance_transactions"`
	Refunds *struct {
		Data []object `json:"data"`
	} `json:"refunds"`
}

type envelope struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Created  int64  `json:"created"`
	Livemode bool   `json:"livemode"`
	Data     struct {
		Object object `json:"object"`
	} `json:"data"`
}

// parse decodes the payload, which must say what ev says.
func parse(t *testing.T, ev stripetest.Generated) envelope {
	var env envelope
	require.NoError(t, json.Unmarshal(ev.Payload, &env))
	require.Equal(t, ev.ID, env.ID)
	require.Equal(t, ev.Type, env.Type)
	require.Equal(t, ev.Livemode, env.Livemode)
	return env
}

func (m *model) apply(t *testing.T, env envelope) {
	if env.Livemode != m.livemode {
		return // the other mode's: stored and ignored
	}
	o := env.Data.Object
	switch env.Type {
	case "refund.created", "refund.updated", "refund.failed", "charge.refund.updated":
		m.refund(o)
	case "charge.refunded":
		if o.Invoice != "" {
			m.links[o.ID] = o.Invoice
		}
		for _, r := range o.Refunds.Data {
			m.refund(r)
		}
	case "invoice_payment.paid":
		for _, p := range []string{o.Payment.PaymentIntent, o.Payment.Charge} {
			if p != "" {
				m.links[p] = o.Invoice
			}
		}
	case "charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed",
		"charge.dispute.funds_withdrawn", "charge.dispute.funds_reinstated":
		m.dispute(env.Type, o)
	default:
		to := target[env.Type]
		require.NotEmpty(t, to, env.Type)
		inv := m.invoices[o.ID]
		snap := [2]int64{env.Created, statusRank[to]}
		switch {
		case inv == nil:
			inv = &modelInvoice{status: to, amountPaid: o.AmountPaid, snapshot: snap, snapshotID: env.ID, amountDue: o.AmountDue}
			m.invoices[o.ID] = inv
			if to == "paid" {
				m.pay(o)
			}
		case slices.Contains(from[to], inv.status):
			inv.status = to
			if to == "paid" {
				inv.amountPaid = o.AmountPaid
				m.pay(o)
			}
		case to == "paid" && inv.status == "void":
			// A payment after a void: booked, paid, and a human told;
			// the same end as a void after the payment.
			inv.status, inv.amountPaid = to, o.AmountPaid
			m.pay(o)
			m.anomalies[o.ID] = true
		case to == "void" && inv.status == "paid":
			m.anomalies[o.ID] = true
		}
		if newer(snap, env.ID, inv.snapshot, inv.snapshotID) {
			inv.snapshot, inv.snapshotID, inv.amountDue = snap, env.ID, o.AmountDue
		}
		if to == "paid" && o.Charge != "" {
			m.links[o.Charge] = o.ID
		}
	}
}

func newer(a [2]int64, aID string, b [2]int64, bID string) bool {
	if a != b {
		return a[0] > b[0] || (a[0] == b[0] && a[1] > b[1])
	}
	return aID > bID
}

func (m *model) pay(o object) {
	if o.PaidOutOfBand {
		m.oob[o.ID] = true
		m.ledger[stripetest.LedgerKey{Invoice: o.ID, Kind: "paid_out_of_band"}] = o.AmountPaid
		return
	}
	if _, ok := m.payments[o.ID]; !ok {
		m.payments[o.ID] = o.AmountPaid
		m.ledger[stripetest.LedgerKey{Invoice: o.ID, Kind: "payment"}] = o.AmountPaid
	}
}

var disputeRank = map[string]int{"needs_response": 0, "warning_needs_response": 0, "under_review": 1, "warning_under_review": 1}

// dispute: a withdrawal is shown by funds_withdrawn and funds_reinstated,
// a reinstatement by funds_reinstated; each amount from the balance
// transaction of its sign, else the dispute's amount.
func (m *model) dispute(typ string, o object) {
	d := m.disputes[o.ID]
	if d == nil {
		d = &modelDispute{charge: o.Charge, status: o.Status}
		m.disputes[o.ID] = d
	}
	rank := func(s string) int {
		if r, ok := disputeRank[s]; ok {
			return r
		}
		return 2
	}
	if rank(o.Status) > rank(d.status) || (rank(o.Status) == rank(d.status) && o.Status > d.status) {
		d.status = o.Status
	}
	movement := func(sign int64) *int64 {
		for _, bt := range o.BalanceTransactions {
			if bt.Amount*sign > 0 {
				return &bt.Amount
			}
		}
		a := sign * o.Amount
		return &a
	}
	if (typ == "charge.dispute.funds_withdrawn" || typ == "charge.dispute.funds_reinstated") && d.withdrawn == nil {
		d.withdrawn = movement(-1)
	}
	if typ == "charge.dispute.funds_reinstated" && d.reinstated == nil {
		d.reinstated = movement(+1)
	}
}

func (m *model) refund(o object) {
	r := m.refunds[o.ID]
	if r == nil {
		r = &modelRefund{amount: o.Amount, status: o.Status}
		m.refunds[o.ID] = r
	}
	if o.Charge != "" {
		r.charge = o.Charge
	}
	if o.PaymentIntent != "" {
		r.pi = o.PaymentIntent
	}
	if refundRank[o.Status] > refundRank[r.status] {
		r.status = o.Status
	}
	r.succeeded = r.succeeded || o.Status == "succeeded"
}

// end books the refunds as the handlers' rules say, under the invoice the
// links name.
func (m *model) end(t *testing.T) stripetest.Expected {
	e := stripetest.Expected{
		Invoices: map[string]stripetest.InvoiceState{}, Ledger: m.ledger, Payments: m.payments, Refunds: map[string]string{},
		Disputes: map[string]string{},
	}
	for inv := range m.payments {
		e.Notifications = append(e.Notifications, inv+" InvoicePaymentBooked")
	}
	for inv := range m.oob {
		e.Notifications = append(e.Notifications, inv+" InvoicePaidOutOfBand")
	}
	for id, d := range m.disputes {
		e.Disputes[id] = d.status
		inv := m.links[d.charge]
		require.NotEmpty(t, inv, "dispute %s ends under its invoice", id)
		if d.withdrawn != nil {
			e.Ledger[stripetest.LedgerKey{Invoice: inv, Kind: "dispute_funds_withdrawn:" + id}] = *d.withdrawn
			e.Notifications = append(e.Notifications, id+" DisputeFundsWithdrawn")
		}
		if d.reinstated != nil {
			e.Ledger[stripetest.LedgerKey{Invoice: inv, Kind: "dispute_funds_reinstated:" + id}] = *d.reinstated
			e.Notifications = append(e.Notifications, id+" DisputeFundsReinstated")
		}
	}
	slices.Sort(e.Notifications)
	for id, inv := range m.invoices {
		e.Invoices[id] = stripetest.InvoiceState{Status: inv.status, AmountDue: inv.amountDue, AmountPaid: inv.amountPaid}
	}
	for id, r := range m.refunds {
		e.Refunds[id] = r.status
		if !r.succeeded {
			continue
		}
		inv := m.links[r.charge]
		if inv == "" {
			inv = m.links[r.pi]
		}
		require.NotEmpty(t, inv, "refund %s ends under its invoice", id)
		e.Ledger[stripetest.LedgerKey{Invoice: inv, Kind: "refund:" + id}] = -r.amount
		if r.status == "failed" || r.status == "canceled" {
			e.Ledger[stripetest.LedgerKey{Invoice: inv, Kind: "refund_reversal:" + id}] = r.amount
		}
	}
	return e
}

func TestStoriesEndInExpectInAnyOrder(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		live := seed%2 == 0
		g := stripetest.NewGenerator(rng, stripetest.Options{Prefix: "t", Livemode: live, OtherMode: true, TwinRate: 0.2})
		evs := g.Shuffled(60)
		want := g.Expect()
		envs := make([]envelope, len(evs))
		for i, ev := range evs {
			envs[i] = parse(t, ev)
		}
		for range 10 {
			rng.Shuffle(len(envs), func(i, j int) { envs[i], envs[j] = envs[j], envs[i] })
			m := newModel(live)
			for _, env := range envs {
				for range 1 + rng.IntN(2) { // a redelivery changes nothing
					m.apply(t, env)
				}
			}
			got := m.end(t)
			require.Empty(t, m.anomalies, "seed %d: no story pays and voids one invoice", seed)
			require.Equal(t, want.Invoices, got.Invoices, "seed %d", seed)
			require.Equal(t, want.Ledger, got.Ledger, "seed %d", seed)
			require.Equal(t, want.Payments, got.Payments, "seed %d", seed)
			require.Equal(t, want.Refunds, got.Refunds, "seed %d", seed)
			require.Equal(t, want.Disputes, got.Disputes, "seed %d", seed)
			require.Equal(t, want.Notifications, got.Notifications, "seed %d", seed)
		}
		require.Len(t, evs, want.Events)
		var other int
		for _, ev := range evs {
			if ev.Livemode != live {
				other++
				require.Contains(t, want.OtherMode, ev.ID)
			}
		}
		require.Len(t, want.OtherMode, other)
	}
}

func TestGeneratorIsDeterministic(t *testing.T) {
	t.Parallel()
	gen := func() ([]stripetest.Generated, stripetest.Expected) {
		g := stripetest.NewGenerator(rand.New(rand.NewPCG(42, 1)), stripetest.Options{Prefix: "d", OtherMode: true, TwinRate: 0.05})
		return g.Shuffled(100), g.Expect()
	}
	a, ea := gen()
	b, eb := gen()
	require.Equal(t, a, b)
	require.Equal(t, ea, eb)
}

// TestEachTellsEveryStory: with Each, every story is told in any
// len(Stories) lifecycles in a row, and the options show in the events.
func TestEachTellsEveryStory(t *testing.T) {
	t.Parallel()
	g := stripetest.NewGenerator(rand.New(rand.NewPCG(7, 7)), stripetest.Options{Livemode: true, TwinRate: 1, Each: true})
	var told []string
	lcs := g.Lifecycles(len(stripetest.Stories))
	require.Equal(t, "in_000001", lcs[0].Invoice, "ids without a prefix")
	for _, l := range lcs {
		told = append(told, l.Story)
		require.Empty(t, l.OtherMode, "OtherMode is off")
		for i := 0; i < len(l.Events); i += 2 {
			require.Equal(t, l.Events[i].ID+"_twin", l.Events[i+1].ID, "TwinRate 1: every event has its twin")
			require.True(t, l.Events[i].Livemode)
		}
	}
	require.Equal(t, stripetest.Stories, told)
	e := g.Expect()
	require.Equal(t, e.Events/2, e.Twins)
	require.Len(t, e.Invoices, len(stripetest.Stories))
}
