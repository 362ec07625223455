package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// event is one Stripe Event object as the simulator sends it: unsigned;
// each delivery attempt signs it afresh.
type event = stripetest.Generated

// delivery is one scheduled delivery of an event: Stripe sending it once,
// or (copies = 2) two copies of it at the same moment. via[i] says which
// path copy i takes: false the signed webhook, true EventBridge (POST
// /_eventbridge, the envelope EventBridge hands a target).
type delivery struct {
	ev     *event
	copies int
	solo   bool // the event's only delivery: nothing else stores its receipt
	via    [2]bool
}

// paths is how plan splits deliveries between the signed webhook and
// EventBridge: ebShare of the events go by EventBridge (0: all signed);
// a duplicate goes by the other path with probability crossShare (the same
// event by both paths), else by the same path.
type paths struct {
	ebShare    float64
	crossShare float64
}

// planned counts what plan scheduled.
type planned struct {
	dups  int // events delivered twice
	eb    int // deliveries by EventBridge (each copy counts)
	cross int // events delivered by both paths (a concurrent pair or two separate deliveries)
}

// plan schedules every event once, adds a duplicate delivery (same event id)
// for about dupRate of them, half of those as a concurrent pair, chooses
// each copy's path (p), and shuffles the lot with rng so that events arrive
// out of order. With p.ebShare = 0 it draws from rng exactly as before
// paths existed, so a seed plans the same signed-only run.
func plan(rng *rand.Rand, evs []event, dupRate float64, p paths) (ds []delivery, n planned) {
	for i := range evs {
		d := delivery{ev: &evs[i], copies: 1, solo: true}
		var first, second bool
		if p.ebShare > 0 {
			first = rng.Float64() < p.ebShare
			second = first
		}
		if rng.Float64() < dupRate {
			d.solo = false
			n.dups++
			if p.ebShare > 0 && rng.Float64() < p.crossShare {
				second = !first
				n.cross++
			}
			if rng.IntN(2) == 0 {
				d.copies = 2
				d.via[1] = second
			} else {
				ds = append(ds, delivery{ev: &evs[i], copies: 1, via: [2]bool{second}})
			}
		}
		d.via[0] = first
		ds = append(ds, d)
	}
	for _, d := range ds {
		for c := range d.copies {
			if d.via[c] {
				n.eb++
			}
		}
	}
	rng.Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	return ds, n
}

// retryPolicy is Stripe's redelivery, scaled from days to seconds:
// exponential backoff with jitter, a bounded number of attempts and a
// bounded total time per delivery.
type retryPolicy struct {
	MaxTries int
	Base     time.Duration
	Cap      time.Duration
	For      time.Duration // give up on a delivery after this long
}

func (p retryPolicy) delay(attempt int) time.Duration {
	d := float64(p.Base) * math.Pow(2, float64(attempt-1))
	d = math.Min(d, float64(p.Cap))
	return time.Duration(d * (0.5 + rand.Float64()/2))
}

// sender delivers events to the webhook (or to the local runner's POST
// /_eventbridge) and counts what happened.
type sender struct {
	client  *http.Client
	url     string
	ebURL   string // the local runner's /_eventbridge; "" when no delivery goes by EventBridge
	secret  string
	policy  retryPolicy
	timeout time.Duration // per HTTP attempt

	sent        atomic.Int64 // deliveries started (each copy counts)
	ok2xx       atomic.Int64 // deliveries that ended with a 2xx
	ebOK2xx     atomic.Int64 // of those, by EventBridge
	retries     atomic.Int64 // attempts beyond each delivery's first
	undelivered atomic.Int64 // deliveries given up without a 2xx
	// ambiguous counts solo deliveries that failed (5xx or transport
	// error) and were then answered "duplicate": the failed attempt had in
	// fact committed the receipt, and the retry was deduplicated.
	ambiguous atomic.Int64

	mu       sync.Mutex
	acked    map[string]bool // event ids that got at least one 2xx
	statuses map[string]int  // non-2xx answers by status, "transport" for errors
}

func newSender(url, ebURL, secret string, concurrency int, policy retryPolicy, timeout time.Duration) *sender {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = concurrency * 2
	tr.MaxIdleConnsPerHost = concurrency * 2
	tr.Proxy = nil // loopback only, whatever the environment says
	return &sender{
		client:   &http.Client{Transport: tr},
		url:      url,
		ebURL:    ebURL,
		secret:   secret,
		policy:   policy,
		timeout:  timeout,
		acked:    map[string]bool{},
		statuses: map[string]int{},
	}
}

// run sends every delivery with at most concurrency in flight and at most
// rate new deliveries a second (0: no limit), and returns when all have
// ended (2xx or given up) or ctx is done.
func (s *sender) run(ctx context.Context, ds []delivery, concurrency int, rate float64) {
	work := make(chan delivery)
	go func() {
		defer close(work)
		var tick <-chan time.Time
		if rate > 0 {
			t := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer t.Stop()
			tick = t.C
		}
		for _, d := range ds {
			if tick != nil {
				select {
				case <-tick:
				case <-ctx.Done():
					return
				}
			}
			select {
			case work <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for d := range work {
				if d.copies == 1 {
					s.deliver(ctx, d.ev, d.solo, d.via[0], 0)
					continue
				}
				// A concurrent duplicate: both copies start together
				// (by one path, or one by each).
				start := make(chan struct{})
				var pair sync.WaitGroup
				for c := range d.copies {
					pair.Go(func() {
						<-start
						s.deliver(ctx, d.ev, false, d.via[c], c)
					})
				}
				close(start)
				pair.Wait()
			}
		})
	}
	wg.Wait()
}

// deliver sends ev until it gets a 2xx, retrying every other answer and
// every transport error with backoff, within the policy's bounds; by
// EventBridge when eb (nth tells a concurrent pair's envelopes apart).
func (s *sender) deliver(ctx context.Context, ev *event, solo, eb bool, nth int) {
	s.sent.Add(1)
	giveUpAt := time.Now().Add(s.policy.For)
	// EventBridge's own id of this delivery: the same on every retry of it
	// (EventBridge and SQS redeliver the same message), another for
	// another delivery of the same Stripe event.
	envelopeID := fmt.Sprintf("eb-%s-%d-%x", ev.ID, nth, rand.Uint32())
	for attempt := 1; ; attempt++ {
		var status int
		var body []byte
		var err error
		if eb {
			status, body, err = s.postEventBridge(ctx, ev, envelopeID)
		} else {
			status, body, err = s.post(ctx, ev)
		}
		if err == nil && status >= 200 && status < 300 {
			s.ok2xx.Add(1)
			if eb {
				s.ebOK2xx.Add(1)
			}
			if solo && attempt > 1 && bytes.Contains(body, []byte(`"outcome":"duplicate"`)) {
				s.ambiguous.Add(1)
			}
			s.mu.Lock()
			s.acked[ev.ID] = true
			s.mu.Unlock()
			return
		}
		key := "transport"
		if err == nil {
			key = strconv.Itoa(status)
		}
		if eb {
			key = "eb" + key
		}
		s.mu.Lock()
		s.statuses[key]++
		s.mu.Unlock()

		wait := s.policy.delay(attempt)
		if attempt >= s.policy.MaxTries || time.Now().Add(wait).After(giveUpAt) || ctx.Err() != nil {
			s.undelivered.Add(1)
			return
		}
		s.retries.Add(1)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			s.undelivered.Add(1)
			return
		}
	}
}

// post makes one attempt. Like Stripe, it signs each attempt with the
// current time.
func (s *sender) post(ctx context.Context, ev *event) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(ev.Payload))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	req.Header.Set("Stripe-Signature", stripetest.Sign(ev.Payload, time.Now(), s.secret))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, body, nil
}

// postEventBridge makes one attempt by EventBridge: the Stripe event in
// the envelope EventBridge hands a target, to the local runner's POST
// /_eventbridge (200 once the receipt has committed, 400 a permanent
// refusal, 5xx retry: internal/ingest.HTTPHandler). A 400 is retried like
// any non-2xx and so ends as undelivered: none may occur.
func (s *sender) postEventBridge(ctx context.Context, ev *event, envelopeID string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	body := stripetest.EventBridge(envelopeID, stripetest.EventBridgeSource, ev.Payload)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.ebURL, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

// statusSummary renders the non-2xx answers as "500:12,transport:3".
func (s *sender) statusSummary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.statuses))
	for k := range s.statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", k, s.statuses[k])
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
