// Command reconcile backfills the inbox from Stripe's Events API over an
// explicit window: the reconciler's code with --since and --until, storing
// what the inbox lacks (source 'reconcile'). Running it twice stores nothing
// new. The high-water mark of the scheduled reconciler is left alone.
//
//	# locally, against DATABASE_URL, with STRIPE_API_KEY (and STRIPE_API_BASE)
//	go run ./cmd/reconcile --since 2026-11-20 --until 2026-11-27T12:00:00Z
//	# against a deployed stage: invokes its reconciler function once per slice
//	go run ./cmd/reconcile --stage prod --since 72h --types invoice.paid,invoice.voided
//
// --since and --until take an RFC 3339 time, a date (UTC midnight), or a
// duration before now (72h). --until defaults to now. On a terminal it shows
// its progress (pages read, stored, already present) as it goes; it always
// ends with a summary line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/stripe-inbox/inbox/internal/bootstrap"
	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/dualstack"
	"github.com/stripe-inbox/inbox/internal/reconcile"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "reconcile:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, env config.Env, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	since := fs.String("since", "", "start of the window: RFC 3339, a date (UTC), or a duration before now such as 72h (required)")
	until := fs.String("until", "", "end of the window (exclusive), same forms (default now)")
	types := fs.String("types", "", "event types, comma-separated (default: every type the handlers read)")
	stage := fs.String("stage", "", "invoke the reconciler function of this deployed stage instead of storing locally")
	slice := fs.Duration("slice", 6*time.Hour, "with --stage: the window is sent in invocations of at most this much")
	if err := fs.Parse(args); err != nil {
		return err
	}
	now := time.Now()
	if *since == "" {
		return errors.New("--since is required")
	}
	from, err := parseTime(*since, now)
	if err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	to := now
	if *until != "" {
		if to, err = parseTime(*until, now); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
	}
	if !from.Before(to) {
		return fmt.Errorf("--since %s is not before --until %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	if now.Sub(from) > reconcile.Horizon {
		fmt.Fprintf(stderr, "note: Stripe lists events of the last 30 days only; the window starts at %s\n", now.Add(-reconcile.Horizon+time.Minute).UTC().Format(time.RFC3339))
	}
	var typeList []string
	if *types != "" {
		for _, t := range strings.Split(*types, ",") {
			typeList = append(typeList, strings.TrimSpace(t))
		}
	}
	p := newProgress(stderr)
	var total reconcile.Summary
	if *stage != "" {
		total, err = remote(ctx, *stage, from, to, typeList, *slice, p)
	} else {
		total, err = local(ctx, env, from, to, typeList, p)
	}
	p.done()
	unsettled := ""
	if total.StoredUnsettled > 0 {
		unsettled = fmt.Sprintf(", %d stored younger than the settle window (Stripe may still deliver them; not counted as missing)", total.StoredUnsettled)
	}
	fmt.Fprintf(stdout, "window %s – %s: %d pages, %d events listed, %d stored (missing), %d already present%s%s\n",
		from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), total.Pages, total.Events, total.Stored, total.AlreadyPresent, unsettled, byType(total.MissingByType))
	return err
}

func byType(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	b, _ := json.Marshal(m)
	return "; stored by type " + string(b)
}

func local(ctx context.Context, env config.Env, from, to time.Time, types []string, p *progress) (reconcile.Summary, error) {
	cfg, err := config.LoadReconcile(env)
	if err != nil {
		return reconcile.Summary{}, err
	}
	if cfg.StoreFunction != "" {
		return reconcile.Summary{}, errors.New("STORE_FUNCTION is set: use --stage to backfill a deployed stage")
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := bootstrap.NewReconciler(ctx, cfg, logger, io.Discard)
	if err != nil {
		return reconcile.Summary{}, err
	}
	defer r.Close()
	r.OnPage = func(pr reconcile.Progress) { p.show(pr.Pages, pr.Stored, pr.AlreadyPresent, pr.Reached) }
	return r.Backfill(ctx, from, to, types)
}

// FunctionName is the deployed reconciler's name for a stage (the stack
// names it so: infra/stack/reconcile.go).
func FunctionName(stage string) string { return "StripeInbox-" + stage + "-reconcile" }

func remote(ctx context.Context, stage string, from, to time.Time, types []string, slice time.Duration, p *progress) (reconcile.Summary, error) {
	cfg, err := dualstack.Load(ctx)
	if err != nil {
		return reconcile.Summary{}, err
	}
	client := lambda.NewFromConfig(cfg)
	return invokeSlices(ctx, client, FunctionName(stage), from, to, types, slice, p)
}

func invokeSlices(ctx context.Context, client reconcile.Invoker, function string, from, to time.Time, types []string, slice time.Duration, p *progress) (reconcile.Summary, error) {
	var total reconcile.Summary
	for a := from; a.Before(to); {
		b := a.Add(slice)
		if b.After(to) {
			b = to
		}
		s, err := reconcile.InvokeBackfill(ctx, client, function, reconcile.Invocation{Since: &a, Until: &b, Types: types})
		total.Pages += s.Pages
		total.Events += s.Events
		total.StoredUnsettled += s.StoredUnsettled
		total.Counts.Add(s.Counts)
		p.show(total.Pages, total.Stored, total.AlreadyPresent, a)
		if err != nil {
			return total, fmt.Errorf("window %s – %s: %w", a.UTC().Format(time.RFC3339), b.UTC().Format(time.RFC3339), err)
		}
		switch {
		case s.Complete:
			a = b
		case s.Reached.After(a):
			a = s.Reached // the invocation's deadline came first: the next one goes on from where it got to
		default:
			return total, fmt.Errorf("window %s – %s: an invocation stopped at its deadline without storing a page; try a shorter --slice",
				a.UTC().Format(time.RFC3339), b.UTC().Format(time.RFC3339))
		}
	}
	return total, nil
}

func parseTime(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q: a duration before now must be positive", s)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q: want RFC 3339 (2026-11-20T00:00:00Z), a date (2026-11-20) or a duration before now (72h)", s)
}

// progress rewrites one status line on a terminal and prints nothing
// otherwise (the summary says it all).
type progress struct {
	w        io.Writer
	terminal bool
	shown    bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

func (p *progress) show(pages, stored, present int, at time.Time) {
	if !p.terminal {
		return
	}
	p.shown = true
	fmt.Fprintf(p.w, "\r%d pages read, %d stored, %d already present (at %s)   ", pages, stored, present, at.UTC().Format("2006-01-02 15:04"))
}

func (p *progress) done() {
	if p.shown {
		fmt.Fprintln(p.w)
	}
}
