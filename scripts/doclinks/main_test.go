package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestAnchorIsGitHubs(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"Stripe API versions":                    "stripe-api-versions",
		"A stage with the wrong `stripeMode`":    "a-stage-with-the-wrong-stripemode",
		"Operating without SQL: `inboxctl`":      "operating-without-sql-inboxctl",
		"Worker: outbox relay":                   "worker-outbox-relay",
		"Refunds booked before migration 0005":   "refunds-booked-before-migration-0005",
		"What it costs per month (us-east-1, $)": "what-it-costs-per-month-us-east-1-",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

func TestBrokenLinksAreReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.md", "# Title\n\n## Two words\n\n## Two words\n\n"+
		"[ok](b.md) [ok](#two-words) [ok](#two-words-1) [ok](b.md#there) [web](https://example.com/x.md)\n"+
		"`[not a link](nowhere.md)`\n```\n[in a fence](nowhere.md)\n```\n"+
		"[missing file](c.md) [missing anchor](b.md#nowhere) [missing local](#three-words)\n")
	write("b.md", "# There\n")
	res, err := check(filepath.Join(dir, "a.md"))
	if err != nil {
		t.Fatal(err)
	}
	if res.checked != 7 {
		t.Errorf("checked %d links, want 7: %v", res.checked, res.broken)
	}
	if len(res.broken) != 3 {
		t.Fatalf("broken = %v, want the 3 on the last line", res.broken)
	}
}
