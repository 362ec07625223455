package stripetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// The invoice-lifecycle generator: the one source of realistic event mixes
// for the permutation test (internal/worker), the load generator
// (scripts/stripesim) and the benchmark (scripts/bench).
//
// Each lifecycle is one invoice's story, told the way Stripe tells it:
// invoice snapshots (created, finalized, paid, voided, marked_uncollectible)
// whose created and amount_due grow with each step; payments that name the
// charge (API versions before 2025-03-31.basil) or only the PaymentIntent
// (invoice_payment.paid); refunds that go pending -> succeeded, succeeded ->
// failed, requires_action -> canceled or pending -> failed, each status in
// refund.created, refund.updated, refund.failed or charge.refund.updated, and
// charge.refunded listing the refunds as they stand; disputes lost and won
// (created, funds withdrawn, updated, funds reinstated, closed), with or
// without their balance transactions; and invoices paid outside Stripe
// (paid_out_of_band, as versions before 2025-03-31.basil say it). Now and then a fact is
// sent as a second Event object (TwinRate), and with OtherMode some events of
// the other Stripe mode come along (a live Connect endpoint also receives
// connected accounts' test-mode events), which must change nothing.
//
// Every story ends in a state that does not depend on the order its events
// are applied in, nor on how often each arrives: statuses only move forward
// and no story reaches two final states; amount_due follows the newest
// snapshot; a refund is booked once it has succeeded and reversed once if
// it then failed or was canceled, under its invoice; a dispute's funds are
// booked withdrawn once, and reinstated once if it was won, under its
// invoice; an invoice paid outside Stripe books paid_out_of_band and no
// payment. Expect is that state.

// Options shape a Generator.
type Options struct {
	// Prefix goes into every id (in_<Prefix>_000001, evt_<Prefix>_..., and
	// the charges', refunds' and PaymentIntents' ids), so that runs sharing a
	// database are told apart by prefix. "" leaves it out.
	Prefix string
	// Livemode is the mode of the events to be booked: the STRIPE_MODE of
	// the deployment under test (false: test).
	Livemode bool
	// OtherMode adds events of the other mode to some stories: they must be
	// stored, marked ignored_other_mode, and touch nothing else.
	OtherMode bool
	// TwinRate is the share of events that are also sent as a second Event
	// object, with an id of its own (<id>_twin) and the same content.
	TwinRate float64
	// Each tells the stories in turn (lifecycle i is Stories[i %
	// len(Stories)]), so that any len(Stories) lifecycles in a row hold every
	// story; by default each is drawn by its weight.
	Each bool
}

// Generated is one Stripe Event object the generator made.
type Generated struct {
	ID       string
	Type     string
	Livemode bool
	Payload  []byte // unsigned JSON; sign it when sending (Sign)
}

// Lifecycle is one invoice's story.
type Lifecycle struct {
	Invoice string
	Story   string
	// Events are the events of the booked mode, in the order Stripe sent
	// them, each followed by its twin when it has one.
	Events []Generated
	// OtherMode are the other mode's events that came with the story.
	OtherMode []Generated
}

// All returns the lifecycle's events of both modes.
func (l Lifecycle) All() []Generated { return append(slices.Clip(l.Events), l.OtherMode...) }

// InvoiceState is what the invoices table must hold for one invoice.
type InvoiceState struct {
	Status     string
	AmountDue  int64 // from the newest snapshot
	AmountPaid int64 // the payment, for a paid invoice; else 0
}

// LedgerKey is the unique key of a ledger entry: (invoice_id, kind).
type LedgerKey struct {
	Invoice string
	Kind    string // payment, paid_out_of_band, refund:<re_id>, refund_reversal:<re_id>, dispute_funds_withdrawn:<dp_id> or dispute_funds_reinstated:<dp_id>
}

// Expected is the state the generated lifecycles must end in.
type Expected struct {
	// Invoices holds every invoice the booked events name, and no other.
	Invoices map[string]InvoiceState
	// Ledger holds every ledger entry and its amount: a payment per paid
	// invoice, and per refund that succeeded a negative refund entry (and a
	// positive reversal when it then failed or was canceled), all under
	// the invoice.
	Ledger map[LedgerKey]int64
	// Payments maps each paid invoice to its payment; each has exactly one
	// InvoicePaymentBooked outbox row, and no other invoice has one.
	Payments map[string]int64
	// Refunds maps every refund the booked events show to its final
	// status; no other refund (say one only the other mode showed) is
	// recorded.
	Refunds map[string]string
	// Disputes maps every dispute the booked events show to its final
	// status; no other is recorded.
	Disputes map[string]string
	// Notifications are the outbox rows, as sorted lines
	// "<aggregate_id> <event_type>": one InvoicePaymentBooked per invoice
	// paid through Stripe, one InvoicePaidOutOfBand per invoice paid outside
	// it, one DisputeFundsWithdrawn and (when won) one
	// DisputeFundsReinstated per dispute; nothing else.
	Notifications []string
	// OtherMode lists the ids of the other mode's events: each receipt is
	// marked ignored_other_mode.
	OtherMode []string
	// Events counts the generated events, twins and the other mode's
	// included.
	Events int
	// Twins counts the second Event objects among them.
	Twins int
}

// LedgerLines returns the ledger as sorted lines "<invoice_id> <kind>
// <amount>".
func (e Expected) LedgerLines() []string {
	var out []string
	for k, amount := range e.Ledger {
		out = append(out, fmt.Sprintf("%s %s %d", k.Invoice, k.Kind, amount))
	}
	slices.Sort(out)
	return out
}

// Stories are the generator's stories, in the order Options.Each tells
// them.
var Stories = func() []string {
	var names []string
	for _, s := range stories {
		names = append(names, s.name)
	}
	return names
}()

// Generator makes invoice lifecycles deterministically from its rng.
type Generator struct {
	rng    *rand.Rand
	opts   Options
	n      int // lifecycles made
	expect Expected
}

// NewGenerator returns a generator drawing from rng: the same rng seed and
// options give the same lifecycles, ids and payloads.
func NewGenerator(rng *rand.Rand, o Options) *Generator {
	return &Generator{rng: rng, opts: o, expect: Expected{
		Invoices: map[string]InvoiceState{},
		Ledger:   map[LedgerKey]int64{},
		Payments: map[string]int64{},
		Refunds:  map[string]string{},
		Disputes: map[string]string{},
	}}
}

// Lifecycles returns the next n lifecycles.
func (g *Generator) Lifecycles(n int) []Lifecycle {
	out := make([]Lifecycle, n)
	for i := range out {
		out[i] = g.Next()
	}
	return out
}

// Shuffled returns the events of the next n lifecycles, both modes, in an
// order drawn from the rng: each event once (redeliveries are the
// sender's business).
func (g *Generator) Shuffled(n int) []Generated {
	var evs []Generated
	for _, l := range g.Lifecycles(n) {
		evs = append(evs, l.All()...)
	}
	g.rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	return evs
}

// Expect returns the state every lifecycle made so far must end in. The
// maps are the generator's own: copy them before changing them.
func (g *Generator) Expect() Expected {
	e := g.expect
	e.OtherMode = slices.Clone(e.OtherMode)
	e.Notifications = slices.Sorted(slices.Values(e.Notifications))
	return e
}

// Next makes the next lifecycle and adds its end state to Expect.
func (g *Generator) Next() Lifecycle {
	i := g.n
	g.n++
	var s story
	if g.opts.Each {
		s = stories[i%len(stories)]
	} else {
		total := 0
		for _, s := range stories {
			total += s.weight
		}
		pick := g.rng.IntN(total)
		for _, s = range stories {
			if pick < s.weight {
				break
			}
			pick -= s.weight
		}
	}
	num := fmt.Sprintf("%06d", i+1)
	l := &teller{
		g:      g,
		num:    num,
		inv:    g.name("in", num),
		ch:     g.name("ch", num),
		pi:     g.name("pi", num),
		cus:    g.name("cus", fmt.Sprintf("%04d", g.rng.IntN(500))),
		amount: int64(100 * (1 + g.rng.IntN(500))),
	}
	l.lc = Lifecycle{Invoice: l.inv, Story: s.name}
	l.status = s.tell(l)
	state := InvoiceState{Status: l.status, AmountDue: l.amountDue}
	switch {
	case l.status == "paid" && l.outOfBand:
		state.AmountPaid = l.amount
		g.expect.Ledger[LedgerKey{l.inv, "paid_out_of_band"}] = l.amount
		g.expect.Notifications = append(g.expect.Notifications, l.inv+" InvoicePaidOutOfBand")
	case l.status == "paid":
		state.AmountPaid = l.amount
		g.expect.Payments[l.inv] = l.amount
		g.expect.Ledger[LedgerKey{l.inv, "payment"}] = l.amount
		g.expect.Notifications = append(g.expect.Notifications, l.inv+" InvoicePaymentBooked")
	}
	for _, d := range l.disputes {
		g.expect.Disputes[d.id] = d.status
		g.expect.Ledger[LedgerKey{l.inv, "dispute_funds_withdrawn:" + d.id}] = -d.amount
		g.expect.Notifications = append(g.expect.Notifications, d.id+" DisputeFundsWithdrawn")
		if d.status == "won" {
			g.expect.Ledger[LedgerKey{l.inv, "dispute_funds_reinstated:" + d.id}] = d.amount
			g.expect.Notifications = append(g.expect.Notifications, d.id+" DisputeFundsReinstated")
		}
	}
	g.expect.Invoices[l.inv] = state
	for _, f := range l.refunds {
		g.expect.Refunds[f.id] = f.statuses[len(f.statuses)-1]
		if !slices.Contains(f.statuses, "succeeded") {
			continue
		}
		g.expect.Ledger[LedgerKey{l.inv, "refund:" + f.id}] = -f.amount
		if last := f.statuses[len(f.statuses)-1]; last == "failed" || last == "canceled" {
			g.expect.Ledger[LedgerKey{l.inv, "refund_reversal:" + f.id}] = f.amount
		}
	}
	return l.lc
}

func (g *Generator) name(kind, rest string) string {
	if g.opts.Prefix == "" {
		return kind + "_" + rest
	}
	return kind + "_" + g.opts.Prefix + "_" + rest
}

// teller tells one story: it makes the events and records the facts.
type teller struct {
	g                   *Generator
	num                 string
	inv, ch, pi, cus    string
	amount              int64
	step                int64 // invoice snapshots so far
	amountDue           int64 // of the newest snapshot
	status              string
	refunds             []*refundFact
	disputes            []*disputeFact
	outOfBand           bool // paid outside Stripe
	events, otherEvents int
	lc                  Lifecycle
}

// refundFact is one refund's history: the statuses it went through, in
// the order Stripe sent them.
type refundFact struct {
	id       string
	amount   int64
	statuses []string
}

// emit adds an event of the booked mode (and maybe its twin).
func (l *teller) emit(typ string, created int64, object map[string]any) {
	id := fmt.Sprintf("%s_%02d", l.g.name("evt", l.num), l.events)
	l.events++
	l.lc.Events = append(l.lc.Events, l.g.event(id, typ, created, l.g.opts.Livemode, object)...)
}

// other adds an event of the other mode (and maybe its twin), when the
// options ask for them.
func (l *teller) other(typ string, created int64, object map[string]any) {
	if !l.g.opts.OtherMode {
		return
	}
	id := fmt.Sprintf("%s_o%02d", l.g.name("evt", l.num), l.otherEvents)
	l.otherEvents++
	evs := l.g.event(id, typ, created, !l.g.opts.Livemode, object)
	for _, e := range evs {
		l.g.expect.OtherMode = append(l.g.expect.OtherMode, e.ID)
	}
	l.lc.OtherMode = append(l.lc.OtherMode, evs...)
}

func (g *Generator) event(id, typ string, created int64, live bool, object map[string]any) []Generated {
	return g.eventIn(id, typ, Meta{Created: created, Livemode: live}, object)
}

// eventVersion is an event of the booked mode in API version v.
func (g *Generator) eventVersion(id, typ string, created int64, v string, object map[string]any) []Generated {
	return g.eventIn(id, typ, Meta{Created: created, Livemode: g.opts.Livemode, APIVersion: v}, object)
}

func (g *Generator) eventIn(id, typ string, m Meta, object map[string]any) []Generated {
	evs := []Generated{{ID: id, Type: typ, Livemode: m.Livemode, Payload: EventWith(id, typ, m, object)}}
	if g.rng.Float64() < g.opts.TwinRate {
		twin := id + "_twin"
		evs = append(evs, Generated{ID: twin, Type: typ, Livemode: m.Livemode, Payload: EventWith(twin, typ, m, object)})
		g.expect.Twins++
	}
	g.expect.Events += len(evs)
	return evs
}

// snapshot sends the invoice in status as event typ: each one is newer
// (created) than the last and has another amount_due, which the invoice
// must end with. A paid snapshot names its charge half of the time, as API
// versions before 2025-03-31.basil do.
func (l *teller) snapshot(typ, status string) {
	l.step++
	o := Invoice(l.inv, l.cus, status, l.amount)
	l.amountDue = l.amount + 10*l.step
	o["amount_due"] = l.amountDue
	if status == "paid" && l.g.rng.IntN(2) == 0 {
		o["charge"] = l.ch
	}
	l.emit(typ, Created+l.step, o)
}

// lifecycle sends the invoice through each status in turn (created,
// finalized, then the rest) and returns the last.
func (l *teller) lifecycle(statuses ...string) string {
	for _, s := range statuses {
		l.snapshot(invoiceEvents[s], s)
	}
	return statuses[len(statuses)-1]
}

var invoiceEvents = map[string]string{
	"draft":         "invoice.created",
	"open":          "invoice.finalized",
	"paid":          "invoice.paid",
	"void":          "invoice.voided",
	"uncollectible": "invoice.marked_uncollectible",
}

// refund starts a refund of amount whose statuses, in Stripe's order, are
// given.
func (l *teller) refund(suffix string, amount int64, statuses ...string) *refundFact {
	f := &refundFact{id: l.g.name("re", l.num+"_"+suffix), amount: amount, statuses: statuses}
	l.refunds = append(l.refunds, f)
	return f
}

// refundEvent sends f in status as event typ, naming its charge (and
// its PaymentIntent when withPI).
func (l *teller) refundEvent(typ string, f *refundFact, status string, withPI bool) {
	o := RefundIn(f.id, l.ch, status, f.amount)
	if withPI {
		o["payment_intent"] = l.pi
	}
	l.emit(typ, Created, o)
}

// listing sends charge.refunded listing each refund in the status given,
// naming the invoice when linked.
func (l *teller) listing(linked bool, refunds ...any) {
	var list []map[string]any
	for i := 0; i < len(refunds); i += 2 {
		f := refunds[i].(*refundFact)
		list = append(list, RefundIn(f.id, l.ch, refunds[i+1].(string), f.amount))
	}
	inv := ""
	if linked {
		inv = l.inv
	}
	l.emit("charge.refunded", Created, ChargeWithRefundList(l.ch, inv, list...))
}

// disputeFact is one dispute: its amount (withdrawn, and reinstated if
// won) and final status.
type disputeFact struct {
	id     string
	amount int64
	status string
}

// dispute tells a dispute of the invoice's charge, lost or won, in
// Stripe's order: created, funds withdrawn, updated (under review), funds
// reinstated when won, closed. The invoice payment links the charge to the
// invoice (invoice_payment.paid, basil). Half the time the events carry
// the balance transactions (in the charge's currency, so the amounts are
// the dispute's); the fee in them is not booked.
func (l *teller) dispute(won bool) {
	l.emit("invoice_payment.paid", Created, map[string]any{
		"id": l.g.name("inpay", l.num), "object": "invoice_payment", "invoice": l.inv, "status": "paid",
		"payment": map[string]any{"type": "charge", "charge": l.ch},
	})
	d := &disputeFact{id: l.g.name("dp", l.num), amount: l.amount / 2, status: "lost"}
	if won {
		d.status = "won"
	}
	l.disputes = append(l.disputes, d)
	var withdrawn, reinstated []map[string]any
	if l.g.rng.IntN(2) == 0 {
		withdrawn = []map[string]any{DisputeBalanceTransaction(l.g.name("txn", l.num+"_w"), -d.amount, 1500, "usd")}
		reinstated = append(slices.Clone(withdrawn), DisputeBalanceTransaction(l.g.name("txn", l.num+"_r"), d.amount, 0, "usd"))
	}
	obj := func(status string, bts []map[string]any) map[string]any {
		return Dispute(d.id, l.ch, "", status, d.amount, bts...)
	}
	l.emit("charge.dispute.created", Created, obj("needs_response", nil))
	l.emit("charge.dispute.funds_withdrawn", Created, obj("needs_response", withdrawn))
	l.emit("charge.dispute.updated", Created, obj("under_review", withdrawn))
	if won {
		l.emit("charge.dispute.funds_reinstated", Created, obj("won", reinstated))
		l.emit("charge.dispute.closed", Created, obj("won", reinstated))
	} else {
		l.emit("charge.dispute.closed", Created, obj("lost", withdrawn))
	}
	// The other mode's dispute of the same charge: never recorded.
	l.other("charge.dispute.funds_withdrawn", Created, Dispute(l.g.name("dp", l.num+"_other"), l.ch, "", "needs_response", d.amount))
}

type story struct {
	name   string
	weight int
	// tell makes the story's events and returns the invoice's final status.
	tell func(l *teller) string
}

var stories = []story{
	{"draft", 5, func(l *teller) string { return l.lifecycle("draft") }},
	{"open", 10, func(l *teller) string { return l.lifecycle("draft", "open") }},
	{"paid", 25, func(l *teller) string { return l.lifecycle("draft", "open", "paid") }},
	{"void", 10, func(l *teller) string {
		st := l.lifecycle("draft", "open", "void")
		// The other mode's payment of the void invoice: booked, it would
		// pay it and raise an anomaly.
		l.other("invoice.paid", Created+99, Invoice(l.inv, l.cus, "paid", l.amount))
		return st
	}},
	{"uncollectible", 5, func(l *teller) string { return l.lifecycle("draft", "open", "uncollectible") }},
	{"uncollectible_paid", 10, func(l *teller) string { return l.lifecycle("draft", "open", "uncollectible", "paid") }},
	{"uncollectible_void", 5, func(l *teller) string {
		st := l.lifecycle("draft", "open", "uncollectible", "void")
		// An invoice only the other mode knows: it must not be created.
		l.other("invoice.created", Created+99, Invoice(l.inv+"_other", l.cus, "draft", l.amount))
		return st
	}},
	// Paid, then two refunds that go pending -> succeeded, with
	// charge.refunded listing them as they stand.
	{"refunded", 12, func(l *teller) string {
		st := l.lifecycle("draft", "open", "paid")
		re1 := l.refund("1", l.amount/4, "pending", "succeeded")
		re2 := l.refund("2", l.amount/2, "pending", "succeeded")
		l.refundEvent("refund.created", re1, "pending", false)
		l.refundEvent("refund.updated", re1, "succeeded", false)
		l.listing(true, re1, "succeeded")
		l.refundEvent("refund.created", re2, "pending", false)
		l.listing(true, re1, "succeeded", re2, "pending")
		l.refundEvent("charge.refund.updated", re2, "succeeded", false)
		l.listing(true, re1, "succeeded", re2, "succeeded")
		// The other mode's refund of the same charge: never recorded.
		l.other("refund.updated", Created, RefundIn(l.g.name("re", l.num+"_other"), l.ch, "succeeded", l.amount/8))
		return st
	}},
	// Paid; one refund succeeds then fails, one is canceled before it
	// succeeds, one fails while pending; a listing shows several statuses
	// at once, the first one with or without the invoice.
	{"refund_failures", 10, func(l *teller) string {
		st := l.lifecycle("draft", "open", "paid")
		reF := l.refund("f", l.amount/10, "succeeded", "failed")
		reC := l.refund("c", l.amount/5, "requires_action", "canceled")
		reP := l.refund("p", l.amount/4, "pending", "failed")
		l.refundEvent("refund.created", reF, "succeeded", false)
		l.refundEvent("refund.failed", reF, "failed", false)
		l.refundEvent("refund.updated", reF, "failed", false)
		l.refundEvent("refund.created", reC, "requires_action", false)
		l.refundEvent("refund.updated", reC, "canceled", false)
		l.refundEvent("refund.created", reP, "pending", false)
		l.refundEvent("refund.failed", reP, "failed", false)
		l.listing(l.g.rng.IntN(2) == 0, reF, "succeeded", reC, "requires_action", reP, "pending")
		l.listing(true, reF, "failed", reC, "canceled", reP, "failed")
		// The other mode says the canceled refund succeeded: it must book
		// nothing.
		l.other("refund.updated", Created, RefundIn(reC.id, l.ch, "succeeded", reC.amount))
		return st
	}},
	// Paid on 2025-03-31.basil: invoice_payment.paid links the
	// PaymentIntent only; each refund's first events name only the charge,
	// a later one names the PaymentIntent too.
	{"payment_intent", 8, func(l *teller) string {
		st := l.lifecycle("draft", "open", "paid")
		l.emit("invoice_payment.paid", Created, map[string]any{
			"id": l.g.name("inpay", l.num), "object": "invoice_payment", "invoice": l.inv, "status": "paid",
			"payment": map[string]any{"type": "payment_intent", "payment_intent": l.pi},
		})
		reS := l.refund("s", l.amount/3, "pending", "succeeded")
		reF := l.refund("f", l.amount/5, "succeeded", "failed")
		l.refundEvent("refund.created", reS, "pending", false)
		l.refundEvent("charge.refund.updated", reS, "succeeded", false)
		l.refundEvent("refund.updated", reS, "succeeded", true)
		l.refundEvent("refund.created", reF, "succeeded", false)
		l.refundEvent("refund.failed", reF, "failed", true)
		l.refundEvent("refund.updated", reF, "failed", false)
		return st
	}},
	// Paid, then disputed: lost (the funds stay withdrawn) or won (they
	// are reinstated).
	{"dispute_lost", 4, func(l *teller) string {
		st := l.lifecycle("draft", "open", "paid")
		l.dispute(false)
		return st
	}},
	{"dispute_won", 4, func(l *teller) string {
		st := l.lifecycle("draft", "open", "paid")
		l.dispute(true)
		return st
	}},
	// Paid outside Stripe, as versions before 2025-03-31.basil say it
	// (paid_out_of_band: true): paid, and nothing booked as a payment.
	{"paid_out_of_band", 4, func(l *teller) string {
		l.lifecycle("draft", "open")
		l.outOfBand = true
		l.step++
		o := Invoice(l.inv, l.cus, "paid", l.amount)
		l.amountDue = l.amount + 10*l.step
		o["amount_due"], o["paid_out_of_band"], o["charge"], o["paid"] = l.amountDue, true, nil, true
		id := fmt.Sprintf("%s_%02d", l.g.name("evt", l.num), l.events)
		l.events++
		l.lc.Events = append(l.lc.Events, l.g.eventVersion(id, "invoice.paid", Created+l.step, "2024-06-20", o)...)
		return "paid"
	}},
}
