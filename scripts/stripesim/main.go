// Command stripesim plays Stripe against the local webhook, then checks that
// the database ended exactly where the events say it must.
//
// It generates invoice lifecycles with internal/stripetest's generator (the
// one the permutation test uses: created, finalized, paid, voided,
// marked_uncollectible then paid or voided, refunds that succeed, fail or are
// canceled, told by refund.* events and charge.refunded listings, payments
// linked by charge or PaymentIntent, and by default events of the other
// Stripe mode, which must be ignored), whose final state does not depend on
// delivery order, and delivers them the way Stripe does: shuffled
// (seeded; the seed is printed), about 10% delivered twice with the same
// event id (half of those as two concurrent requests), some facts sent as two
// Event objects with different ids, signed afresh on every attempt, and
// every non-2xx answer or transport error retried with exponential backoff
// within bounds.
//
// Then it waits (bounded) for the worker to drain the run's receipts and
// compares the database with the expected state table by table (receipts,
// invoices, ledger, outbox, anomalies; one line each on stderr), printing one
// line of figures:
//
//	scenario=<name> sent=.. ok2xx=.. retries=.. faults=.. lost=.. doubled=.. unprocessed=.. needs_review=.. ...
//
// lost, wrong and doubled are the sums over the tables; the per-table
// figures follow (invoices_lost=.. ledger_doubled=.. and so on).
//
// It exits 1 when anything was lost, doubled, wrong or left unprocessed, when
// a 2xx'd event has no receipt row, or when a delivery never got a 2xx.
//
// With -eventbridge-url (the local runner's POST /_eventbridge) about half
// of the events go by EventBridge instead, in the envelope EventBridge hands
// a target (source aws.partner/stripe.com/ed_test_..., detail the Event),
// and most duplicates go one copy by each path, some as a concurrent pair:
// the same event by both paths must be one receipt and one effect. The
// figures line then ends with via_eventbridge, ok2xx_eventbridge,
// cross_path and receipts_eventbridge.
//
// With -stripe-api (the Stripe API stand-in, scripts/stripeapistandin, that
// the workers' write-back sender calls with WRITEBACKS=customer_metadata)
// it also checks that every payment of the run was written back exactly
// once: one intent, recorded as sent with the customer's id, and one
// request the stand-in ran under its key (replays counted, not failures).
// The figures line then carries writeback_* figures (writebacks.go).
//
// -phase splits the run for fault scripts that must act between sending and
// draining: "send" delivers and writes -state; "check" reads -state,
// regenerates the same events from its seed and checks. "all" does both.
//
//	go run ./scripts/stripesim -invoices 200 -db "$DATABASE_URL"
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

type options struct {
	phase       string
	scenario    string
	url         string
	db          string
	endpoint    string
	secret      string
	invoices    int
	seed        uint64
	dupRate     float64
	twinRate    float64
	live        bool // the worker's STRIPE_MODE is live
	otherMode   bool // also send events of the other mode
	concurrency int
	rate        float64
	policy      retryPolicy
	httpTimeout time.Duration
	sendTimeout time.Duration
	drainFor    time.Duration
	maxAttempts int
	faults      int
	faultsFile  string
	state       string
	eventbridge string
	stripeAPI   string
	ebURL       string
	paths       paths
}

// state is what -phase send hands to -phase check.
type state struct {
	Seed        uint64   `json:"seed"`
	Invoices    int      `json:"invoices"`
	TwinRate    float64  `json:"twin_rate"`
	Live        bool     `json:"live"`
	OtherMode   bool     `json:"other_mode"`
	Sent        int64    `json:"sent"`
	OK2xx       int64    `json:"ok2xx"`
	ViaEB       int64    `json:"via_eventbridge"`
	OK2xxEB     int64    `json:"ok2xx_eventbridge"`
	CrossPath   int      `json:"cross_path"`
	Retries     int64    `json:"retries"`
	Undelivered int64    `json:"undelivered"`
	Ambiguous   int64    `json:"ambiguous"`
	Statuses    string   `json:"statuses"`
	Acked       []string `json:"acked"`
}

func main() {
	var o options
	flag.StringVar(&o.phase, "phase", "all", "all, send (deliver and write -state) or check (read -state and check)")
	flag.StringVar(&o.scenario, "scenario", "plain", "name printed in the figures line")
	flag.StringVar(&o.url, "url", "http://127.0.0.1:8080/billing", "the webhook endpoint URL")
	flag.StringVar(&o.db, "db", os.Getenv("DATABASE_URL"), "pgx URL of the database to check (default $DATABASE_URL)")
	flag.StringVar(&o.endpoint, "endpoint", "billing", "the endpoint name the receipts are stored under")
	flag.StringVar(&o.secret, "secret", os.Getenv("STRIPE_WEBHOOK_SECRET"), "signing secret (default $STRIPE_WEBHOOK_SECRET; the first of a comma list)")
	flag.IntVar(&o.invoices, "invoices", 200, "number of invoice lifecycles")
	flag.Uint64Var(&o.seed, "seed", 0, "shuffle and generation seed (0: random, printed)")
	flag.Float64Var(&o.dupRate, "dup-rate", 0.10, "share of events delivered twice with the same id")
	flag.Float64Var(&o.twinRate, "twin-rate", 0.05, "share of facts sent as two Event objects (different ids)")
	mode := flag.String("mode", "test", "the worker's STRIPE_MODE (test or live): the mode of the events to be booked")
	flag.BoolVar(&o.otherMode, "other-mode", true, "also send events of the other mode, which must be stored and ignored")
	flag.IntVar(&o.concurrency, "concurrency", 8, "deliveries in flight at once")
	flag.Float64Var(&o.rate, "rate", 0, "new deliveries per second at most (0: as fast as concurrency allows)")
	flag.IntVar(&o.policy.MaxTries, "max-tries", 20, "attempts per delivery before giving up")
	flag.DurationVar(&o.policy.Base, "retry-base", 100*time.Millisecond, "first retry delay (doubles each attempt, jittered 50-100%)")
	flag.DurationVar(&o.policy.Cap, "retry-cap", 3*time.Second, "longest retry delay")
	flag.DurationVar(&o.policy.For, "retry-for", 90*time.Second, "give up on a delivery after this long")
	flag.DurationVar(&o.httpTimeout, "http-timeout", 10*time.Second, "timeout of one HTTP attempt")
	flag.DurationVar(&o.sendTimeout, "send-timeout", 10*time.Minute, "bound on the whole sending phase")
	flag.DurationVar(&o.drainFor, "drain-timeout", 2*time.Minute, "how long the backlog may stop shrinking before the drain counts as stuck (the drain itself may take longer; the relay check waits this long for the outbox)")
	flag.IntVar(&o.maxAttempts, "max-attempts", 50, "the worker's MAX_ATTEMPTS (receipts at it need review)")
	flag.IntVar(&o.faults, "faults", 0, "faults the caller injected (reported only)")
	flag.StringVar(&o.faultsFile, "faults-file", "", "read the fault count from this file when reporting (for a caller that injects faults while stripesim runs)")
	flag.StringVar(&o.state, "state", "", "state file between -phase send and -phase check")
	flag.StringVar(&o.eventbridge, "eventbridge", "", "URL of the EventBridge stand-in the workers' outbox relay publishes to (scripts/ebstandin); set: check that every outbox row of the run is published")
	flag.StringVar(&o.stripeAPI, "stripe-api", "", "URL of the Stripe API stand-in the workers' write-back sender calls (scripts/stripeapistandin; the workers run with WRITEBACKS=customer_metadata); set: check that every payment of the run was written back exactly once")
	flag.StringVar(&o.ebURL, "eventbridge-url", "", "URL of the local runner's POST /_eventbridge; set: about -eventbridge-share of the events are delivered by EventBridge (the envelope it hands a target) instead of signed to -url")
	flag.Float64Var(&o.paths.ebShare, "eventbridge-share", 0.5, "with -eventbridge-url: share of the events delivered by EventBridge")
	flag.Float64Var(&o.paths.crossShare, "cross-share", 0.75, "with -eventbridge-url: share of the duplicates whose second copy takes the other path (the same event by both)")
	flag.Parse()
	if o.ebURL == "" {
		o.paths = paths{}
	}
	o.live = *mode == "live"
	if *mode != "live" && *mode != "test" {
		fmt.Fprintf(os.Stderr, "stripesim: -mode=%q: must be test or live (the worker's STRIPE_MODE)\n", *mode)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stripesim:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, o options) (int, error) {
	if err := o.validate(); err != nil {
		return 2, err
	}
	var st state
	switch o.phase {
	case "all", "send":
		if o.seed == 0 {
			o.seed = rand.Uint64() >> 12 // fits a JSON number exactly
		}
		st = send(ctx, o)
		if o.phase == "send" {
			b, err := json.Marshal(st)
			if err != nil {
				return 2, err
			}
			if err := os.WriteFile(o.state, b, 0o600); err != nil {
				return 2, fmt.Errorf("writing -state: %w", err)
			}
			if st.Undelivered > 0 {
				return 1, fmt.Errorf("%d deliveries never got a 2xx", st.Undelivered)
			}
			return 0, nil
		}
	case "check":
		b, err := os.ReadFile(o.state)
		if err != nil {
			return 2, fmt.Errorf("reading -state: %w", err)
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return 2, fmt.Errorf("reading -state: %w", err)
		}
		o.seed, o.invoices, o.twinRate, o.live, o.otherMode = st.Seed, st.Invoices, st.TwinRate, st.Live, st.OtherMode
	}
	return verify(ctx, o, st)
}

func (o options) validate() error {
	var errs []error
	switch o.phase {
	case "all", "send", "check":
	default:
		errs = append(errs, fmt.Errorf("-phase=%q: must be all, send or check", o.phase))
	}
	if o.phase != "all" && o.state == "" {
		errs = append(errs, fmt.Errorf("-phase=%s needs -state", o.phase))
	}
	if o.phase != "check" {
		if !strings.HasPrefix(firstSecret(o.secret), "whsec_") {
			errs = append(errs, errors.New("set -secret or STRIPE_WEBHOOK_SECRET to the webhook's signing secret (whsec_...)"))
		}
		if o.ebURL != "" && (o.paths.ebShare <= 0 || o.paths.ebShare > 1 || o.paths.crossShare < 0 || o.paths.crossShare > 1) {
			errs = append(errs, errors.New("-eventbridge-share must be in (0, 1] and -cross-share in [0, 1]"))
		}
		if o.invoices < 1 || o.concurrency < 1 || o.policy.MaxTries < 1 {
			errs = append(errs, errors.New("-invoices, -concurrency and -max-tries must be at least 1"))
		}
	}
	if o.phase != "send" && o.db == "" {
		errs = append(errs, errors.New("set -db (or DATABASE_URL) to the database the webhook writes to"))
	}
	return errors.Join(errs...)
}

func firstSecret(s string) string {
	first, _, _ := strings.Cut(s, ",")
	return strings.TrimSpace(first)
}

// runID names a run's objects, so that its rows are told apart from any
// other run's in the same database.
func runID(seed uint64) string { return fmt.Sprintf("s%x", seed) }

func rngFor(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// generate makes the run's events with the generator of internal/stripetest,
// deterministically from rng, and the state they must end in.
func generate(rng *rand.Rand, o options) ([]event, stripetest.Expected) {
	g := stripetest.NewGenerator(rng, stripetest.Options{
		Prefix: runID(o.seed), Livemode: o.live, OtherMode: o.otherMode, TwinRate: o.twinRate,
	})
	var evs []event
	for _, l := range g.Lifecycles(o.invoices) {
		evs = append(evs, l.All()...)
	}
	return evs, g.Expect()
}

func send(ctx context.Context, o options) state {
	rng := rngFor(o.seed)
	evs, exp := generate(rng, o)
	ds, n := plan(rng, evs, o.dupRate, o.paths)
	fmt.Fprintf(os.Stderr, "stripesim: scenario=%s seed=%d invoices=%d events=%d twins=%d other_mode=%d duplicates=%d deliveries=%d via_eventbridge=%d cross_path=%d concurrency=%d\n",
		o.scenario, o.seed, o.invoices, len(evs), exp.Twins, len(exp.OtherMode), n.dups, len(ds), n.eb, n.cross, o.concurrency)

	s := newSender(o.url, o.ebURL, firstSecret(o.secret), o.concurrency, o.policy, o.httpTimeout)
	sendCtx, cancel := context.WithTimeout(ctx, o.sendTimeout)
	defer cancel()
	start := time.Now()
	s.run(sendCtx, ds, o.concurrency, o.rate)
	fmt.Fprintf(os.Stderr, "stripesim: delivered in %s: sent=%d ok2xx=%d retries=%d undelivered=%d ambiguous=%d non2xx=%s\n",
		time.Since(start).Round(time.Millisecond), s.sent.Load(), s.ok2xx.Load(), s.retries.Load(), s.undelivered.Load(), s.ambiguous.Load(), s.statusSummary())

	st := state{
		Seed: o.seed, Invoices: o.invoices, TwinRate: o.twinRate, Live: o.live, OtherMode: o.otherMode,
		Sent: s.sent.Load(), OK2xx: s.ok2xx.Load(), ViaEB: int64(n.eb), OK2xxEB: s.ebOK2xx.Load(), CrossPath: n.cross, Retries: s.retries.Load(), Undelivered: s.undelivered.Load(),
		Ambiguous: s.ambiguous.Load(), Statuses: s.statusSummary(),
	}
	for id := range s.acked {
		st.Acked = append(st.Acked, id)
	}
	return st
}

func verify(ctx context.Context, o options, st state) (int, error) {
	run := runID(o.seed)
	evs, exp := generate(rngFor(o.seed), o)

	waited, drained := waitDrained(ctx, o.db, o.endpoint, run, o.maxAttempts, o.drainFor)
	fmt.Fprintf(os.Stderr, "stripesim: drain wait %s (drained=%t)\n", waited.Round(time.Millisecond), drained)

	checkCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := connect(checkCtx, o.db)
	if err != nil {
		return 2, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	r, err := check(checkCtx, conn, o.endpoint, run, o.maxAttempts, exp, st.Acked)
	if err != nil {
		return 2, err
	}
	for _, line := range r.tables() {
		fmt.Fprintln(os.Stderr, "stripesim: check", line)
	}
	var rel relayed
	if o.eventbridge != "" {
		rel, err = checkRelayed(ctx, o.db, o.eventbridge, "in_"+run+"_", o.drainFor)
		if err != nil {
			return 2, err
		}
	}
	var wb writebacks
	if o.stripeAPI != "" {
		payments, err := paidCustomers(evs, exp.Payments)
		if err != nil {
			return 2, err
		}
		wb, err = checkWritebacks(ctx, o.db, o.stripeAPI, run, payments, o.drainFor)
		if err != nil {
			return 2, err
		}
	}
	// Some deliveries went by EventBridge and were answered 2xx, but no
	// receipt says so: the run did not test the path it claims to.
	ebMissing := st.OK2xxEB > 0 && r.Receipts.EventBridge == 0
	if o.faultsFile != "" {
		if b, err := os.ReadFile(o.faultsFile); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				o.faults = n
			}
		}
	}
	line := fmt.Sprintf("scenario=%s sent=%d ok2xx=%d retries=%d faults=%d lost=%d doubled=%d unprocessed=%d needs_review=%d receipt_lost=%d wrong=%d anomalies=%d undelivered=%d ambiguous=%d reattempted=%d events=%d receipts=%d other_mode=%d non2xx=%s seed=%d %s",
		o.scenario, st.Sent, st.OK2xx, st.Retries, o.faults, r.lost(), r.doubled(), r.Receipts.Unprocessed, r.Receipts.NeedsReview,
		r.Receipts.Lost, r.wrong(), r.Anomalies, st.Undelivered, st.Ambiguous, r.Receipts.Reattempted, len(evs), r.Receipts.Rows,
		len(exp.OtherMode), st.Statuses, o.seed, r.perTable())
	if o.eventbridge != "" {
		// The outbox relay's end state, at the end of the figures line.
		// (relay_*: outbox_lost and outbox_doubled are the outbox table's
		// own check above.)
		line += fmt.Sprintf(" relay_rows=%d relay_unpublished=%d relay_lost=%d relay_duplicates=%d", rel.Rows, rel.Unpublished, rel.Lost, rel.Duplicates)
	}
	if o.stripeAPI != "" {
		// The sample write-back's end state (writebacks.go).
		line += " " + wb.figures()
	}
	if st.ViaEB > 0 {
		// Both paths: how many deliveries and receipts each took, and how
		// many events came by both (each must be one receipt, one effect).
		line += fmt.Sprintf(" via_eventbridge=%d ok2xx_eventbridge=%d cross_path=%d receipts_eventbridge=%d",
			st.ViaEB, st.OK2xxEB, st.CrossPath, r.Receipts.EventBridge)
	}
	fmt.Println(line)
	if ebMissing {
		return 1, errors.New("check failed: deliveries by EventBridge were answered 2xx but no receipt has source eventbridge")
	}
	if r.failed() || st.Undelivered > 0 || rel.Unpublished+rel.Lost > 0 || wb.failed() {
		return 1, errors.New("check failed: see the figures line")
	}
	return 0, nil
}
