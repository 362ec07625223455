package config

import (
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/reconcile"
)

// DefaultStripeAPIBase is Stripe's API (STRIPE_API_BASE's default).
const DefaultStripeAPIBase = "https://api.stripe.com"

// Reconcile is the reconciler's configuration: the function outside the VPC
// (it hands pages to the store function, STORE_FUNCTION), or a local run
// and the backfill (they store through DATABASE_URL).
type Reconcile struct {
	StripeCaller
	Client    reconcile.ClientConfig // Key is filled once fetched
	Reconcile reconcile.Config
}

// ReconcileStore is the store function's configuration.
type ReconcileStore struct {
	Common
	// Endpoints are the endpoints it stores events for (RECONCILE_ENDPOINTS).
	Endpoints []string
	// ReconcilerRoleARN is the reconciler function's role
	// (RECONCILER_ROLE_ARN): the only principal whose requests it serves
	// (see internal/invokeproof).
	ReconcilerRoleARN string
}

// HandlerTypes are the event types the handlers subscribe to: what the
// reconciler lists. Thin (v2) event types are not: they are never on
// GET /v1/events (https://docs.stripe.com/api/v2/events).
func HandlerTypes() []string {
	var ts []string
	for t := range handlers.Default() {
		if strings.HasPrefix(t, "v2.") {
			continue
		}
		ts = append(ts, t)
	}
	return ts
}

// LoadReconcile reads:
//   - the key: STRIPE_API_KEY_SECRET_ARN (AWS: a Secrets Manager secret
//     holding a restricted key) or STRIPE_API_KEY (local), exactly one;
//     STRIPE_MODE (optional: live or test) must match the key's mode;
//   - STRIPE_API_BASE (default https://api.stripe.com; a stand-in or
//     stripe-mock in tests);
//   - where pages go: STORE_FUNCTION (AWS) or DATABASE_URL (local), exactly one;
//   - RECONCILE_ENDPOINT (default WEBHOOK_ENDPOINT, else billing): the
//     endpoint the events are stored for;
//   - RECONCILE_LOOKBACK (3d; 1m to 30d, Stripe's horizon): the first
//     window; RECONCILE_OVERLAP (10m; 0 to 24h); RECONCILE_SETTLE (1h; 0 to
//     72h: the window ends this far behind now, so that Stripe's own retries
//     deliver first; see reconcile.DefaultSettle); RECONCILE_SLICE (6h; 1m
//     to 30d: the widest span the probe for a window's oldest page lists);
//   - RECONCILE_RATE (5 requests/s; 1 to 100, Stripe's live read limit; 25
//     in test mode), RECONCILE_MAX_ATTEMPTS (8; 1 to 20),
//     RECONCILE_PAGE_LIMIT (100; 1 to 100), DEADLINE_MARGIN (20s),
//     SECRET_FETCH_TIMEOUT (2s).
func LoadReconcile(env Env) (Reconcile, error) {
	var p problems
	c := Reconcile{StripeCaller: p.stripeCaller(env, "reconcile", "")}

	c.Client.BaseURL = p.stripeAPIBase(env)
	// The client's settings are checked here (no package validates them).
	c.Client.Rate = float64(p.intIn(env, "RECONCILE_RATE", reconcile.DefaultRate, 1, reconcile.LiveReadLimit))
	c.Client.MaxAttempts = p.intIn(env, "RECONCILE_MAX_ATTEMPTS", 8, 1, 20)

	p.storeOrDatabase(env, &c.StripeCaller, "the store function", "nowhere to store", "inbox-reconcile")

	rc := reconcile.Config{Types: HandlerTypes()}
	rc.Endpoint = strings.TrimSpace(env("RECONCILE_ENDPOINT"))
	if rc.Endpoint == "" {
		rc.Endpoint = strings.TrimSpace(env("WEBHOOK_ENDPOINT"))
	}
	if rc.Endpoint == "" {
		rc.Endpoint = "billing"
	}
	if !EndpointName.MatchString(rc.Endpoint) {
		p.addf("RECONCILE_ENDPOINT=%q: must be an endpoint name (lower-case letters, digits, - and _)", rc.Endpoint)
	}
	// Parsed here; the ranges are reconcile.Config.Validate's.
	rc.Lookback = p.durationOrDays(env, "RECONCILE_LOOKBACK", reconcile.DefaultLookback)
	rc.Overlap = p.duration(env, "RECONCILE_OVERLAP", reconcile.DefaultOverlap)
	rc.Settle = p.duration(env, "RECONCILE_SETTLE", reconcile.DefaultSettle)
	rc.Slice = p.durationOrDays(env, "RECONCILE_SLICE", reconcile.DefaultSlice)
	rc.PageLimit = p.wholeNumber(env, "RECONCILE_PAGE_LIMIT", reconcile.PageLimit)
	rc.DeadlineMargin = p.duration(env, "DEADLINE_MARGIN", reconcile.DefaultMargin)
	p.addErr("", rc.Validate())
	c.Reconcile = rc
	return c, p.err()
}

// stripeAPIBase reads STRIPE_API_BASE (default Stripe's API): a base URL,
// https, or http only on a loopback address (a stand-in in tests).
func (p *problems) stripeAPIBase(env Env) string {
	base := strings.TrimSpace(env("STRIPE_API_BASE"))
	if base == "" {
		base = DefaultStripeAPIBase
	}
	if u, err := url.Parse(base); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		p.addf("STRIPE_API_BASE=%q: must be a base URL such as https://api.stripe.com or http://127.0.0.1:12111", base)
	} else if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		// The key travels in every request's Authorization header.
		p.addf("STRIPE_API_BASE=%q: plain http sends the Stripe key in clear; use https (http only on a loopback address: 127.0.0.1, ::1, localhost)", base)
	}
	return strings.TrimSuffix(base, "/")
}

// LoadReconcileStore reads RECONCILE_ENDPOINTS (default billing: the
// endpoints whose events it stores, separated by commas),
// RECONCILER_ROLE_ARN (required: the reconciler's role, whose proofs it
// admits; the STS endpoint it verifies them with is the SDK's, see
// invokeproof.Endpoint) and the database settings.
func LoadReconcileStore(env Env) (ReconcileStore, error) {
	var p problems
	c := ReconcileStore{Common: p.common(env, "reconcilestore", 2)}
	c.ReconcilerRoleARN = p.callerRole(env, "RECONCILER_ROLE_ARN", "the store function", "the reconciler's role")
	raw := strings.TrimSpace(env("RECONCILE_ENDPOINTS"))
	if raw == "" {
		raw = "billing"
	}
	for _, e := range strings.Split(raw, ",") {
		e = strings.TrimSpace(e)
		if !EndpointName.MatchString(e) {
			p.addf("RECONCILE_ENDPOINTS=%q: %q is not an endpoint name", raw, e)
			continue
		}
		c.Endpoints = append(c.Endpoints, e)
	}
	return c, p.err()
}

// durationOrDays parses name as a Go duration or a whole number of days
// ("3d"); def when unset. Its range is checked by the package that owns it.
func (p *problems) durationOrDays(env Env, name string, def time.Duration) time.Duration {
	raw := strings.TrimSpace(env(name))
	if n, ok := strings.CutSuffix(raw, "d"); ok && raw != "" {
		d, err := strconv.Atoi(n)
		if err != nil || d < 0 || d > 3650 {
			p.addf("%s=%q: must be a duration such as 3d, 12h or 30m (default %s)", name, raw, def)
			return def
		}
		return time.Duration(d) * 24 * time.Hour
	}
	return p.duration(env, name, def)
}

// LocalReconcile is the local runner's reconciler component. It runs when
// STRIPE_API_KEY is set (and, when LOCAL_COMPONENTS is set, only if it lists
// it).
const LocalReconcile = "reconcile"

// loadLocalReconcile reads the local contract of the reconciler:
// STRIPE_API_KEY (it runs only when set), RECONCILE_INTERVAL (default 15m,
// 1s to 24h), STRIPE_API_BASE, RECONCILE_LOOKBACK (3d, at most 30d),
// RECONCILE_SETTLE (at most 72h) and the other LoadReconcile variables; the
// events are stored for WEBHOOK_ENDPOINT through DATABASE_URL.
func (p *problems) loadLocalReconcile(env Env, l *Local) {
	listed := slices.Contains(l.Components, LocalReconcile)
	keySet := strings.TrimSpace(env("STRIPE_API_KEY")) != ""
	explicit := strings.TrimSpace(env("LOCAL_COMPONENTS")) != ""
	switch {
	case listed && !keySet:
		p.addf("LOCAL_COMPONENTS lists reconcile but STRIPE_API_KEY is not set: the reconciler needs a Stripe API key (rk_test_...)")
		return
	case !keySet || (explicit && !listed):
		l.Components = slices.DeleteFunc(l.Components, func(c string) bool { return c == LocalReconcile })
		return
	}
	if !listed {
		l.Components = append(l.Components, LocalReconcile)
	}
	l.ReconcileInterval = p.durationIn(env, "RECONCILE_INTERVAL", 15*time.Minute, time.Second, 24*time.Hour)
	renv := func(k string) string {
		if k == "STRIPE_API_KEY_SECRET_ARN" || k == "STORE_FUNCTION" {
			return "" // locally the key is literal and the database is direct
		}
		return env(k)
	}
	var err error
	if l.Reconcile, err = LoadReconcile(renv); err != nil {
		p.addf("%v", err)
	}
}

// loopbackHost reports whether host is a loopback name or address.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
