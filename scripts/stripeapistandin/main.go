// Command stripeapistandin runs the Stripe API stand-in
// (internal/stripeapitest) as a process of its own, for the fault suite
// (scripts/chaos.sh), as scripts/ebstandin does for EventBridge: it prints
// "listening on URL" and serves until killed. Point the write-back sender
// at it with WRITEBACKS=customer_metadata, STRIPE_API_BASE=URL and
// STRIPE_API_KEY=sk_test_stand_in.
//
// It keeps Stripe's idempotency semantics (a known key replays its first
// result, https://docs.stripe.com/api/idempotent_requests), every customer
// id exists, and it misbehaves as Stripe may: of the requests no earlier
// fault decided, about -rate-limited answer 429, about -server-errors a
// 500 or 503 without running, and about -apply-then-fail run and then
// fail their answer (half a 500, half the connection closed with nothing
// written), so the sender's retries, with the same key, are exercised.
//
// GET URL/_standin/applied lists, per Idempotency-Key, the customer it
// changed, the requests that ran (applied) and those answered from the
// saved result (replayed): scripts/stripesim -stripe-api URL checks that
// every write-back of its run was applied exactly once.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/stripe-inbox/inbox/internal/stripeapitest"
)

// AppliedPath lists what the stand-in applied (Applied, JSON).
const AppliedPath = "/_standin/applied"

// Applied is one Idempotency-Key's requests.
type Applied struct {
	Key      string `json:"key"`
	Customer string `json:"customer"` // the last customer a request with the key named
	Applied  int    `json:"applied"`  // requests that ran (changed the customer)
	Replayed int    `json:"replayed"` // requests answered from the saved result
}

func main() {
	limited := flag.Float64("rate-limited", 0.03, "share of requests answered 429 (not run)")
	serverErr := flag.Float64("server-errors", 0.04, "share of requests answered 500 or 503 (not run)")
	applyFail := flag.Float64("apply-then-fail", 0.06, "share of requests run and then failed (500, or the connection closed)")
	seed := flag.Uint64("seed", 0, "seed of the faults (0: random)")
	flag.Parse()
	if *seed == 0 {
		*seed = rand.Uint64()
	}
	rng := rand.New(rand.NewPCG(*seed, 0x57a1))
	api := stripeapitest.New()
	defer api.Close()
	api.AnyCustomer()
	api.FailWith(func(string) (stripeapitest.Fault, bool) { // under the stand-in's lock
		x := rng.Float64()
		switch {
		case x < *limited:
			return stripeapitest.Fault{Status: http.StatusTooManyRequests}, true
		case x < *limited+*serverErr:
			return stripeapitest.Fault{Status: []int{500, 503}[rng.IntN(2)]}, true
		case x < *limited+*serverErr+*applyFail:
			return stripeapitest.Fault{ApplyThenFail: true, Status: []int{500, 0}[rng.IntN(2)]}, true
		}
		return stripeapitest.Fault{}, false
	})

	mux := http.NewServeMux()
	mux.HandleFunc("GET "+AppliedPath, func(w http.ResponseWriter, _ *http.Request) {
		byKey := map[string]*Applied{}
		var out []*Applied
		for _, r := range api.Requests() {
			if r.Method != http.MethodPost || r.IdempotencyKey == "" || !(r.Executed || r.Replayed) {
				continue
			}
			a := byKey[r.IdempotencyKey]
			if a == nil {
				a = &Applied{Key: r.IdempotencyKey}
				byKey[r.IdempotencyKey] = a
				out = append(out, a)
			}
			a.Customer = strings.TrimPrefix(r.Path, "/v1/customers/")
			if r.Executed {
				a.Applied++
			} else {
				a.Replayed++
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.Handle("/", api)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	fmt.Printf("listening on %s (fault seed %d)\n", srv.URL, *seed)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
}
