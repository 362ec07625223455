package opscli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stripe-inbox/inbox/internal/inbox"
	"github.com/stripe-inbox/inbox/internal/ops"
	"github.com/stripe-inbox/inbox/internal/writeback"
)

// render writes resp for people: aligned tables, times in UTC.
func render(w io.Writer, resp ops.Response, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	switch {
	case resp.Status != nil:
		renderStatus(tw, resp.Status)
	case resp.Receipts != nil:
		renderReceipts(tw, resp.Receipts, now)
	case resp.Show != nil:
		renderShow(tw, resp.Show)
	case resp.Retry != nil:
		renderRetry(tw, resp.Retry)
	case resp.Outbox != nil:
		renderOutbox(tw, resp.Outbox)
	case resp.OutboxRetry != nil:
		renderOutboxRetry(tw, resp.OutboxRetry)
	case resp.Writebacks != nil:
		renderWritebacks(tw, resp.Writebacks)
	case resp.Writeback != nil:
		renderWriteback(tw, resp.Writeback)
	case resp.WritebackRetry != nil:
		renderWritebackRetry(tw, resp.WritebackRetry)
	case resp.Anomalies != nil:
		if resp.Anomalies.Count == 0 {
			fmt.Fprintln(tw, "no open anomalies")
			return
		}
		fmt.Fprintln(tw, "ID\tKIND\tSUBJECT\tACCOUNT\tENDPOINT\tEVENT\tCREATED\tRESOLVED\tRESOLUTION")
		for _, a := range resp.Anomalies.Anomalies {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.SubjectID, accountOf(a.Account), a.Endpoint, a.EventID, ts(&a.CreatedAt), ts(a.ResolvedAt), a.Resolution)
		}
	case resp.Resolved != nil:
		a := resp.Resolved.Anomaly
		fmt.Fprintf(tw, "resolved anomaly %d (%s of %s) at %s: %s\naudit row %d\n", a.ID, a.Kind, a.SubjectID, ts(a.ResolvedAt), a.Resolution, resp.Resolved.AuditID)
	case resp.Secrets != nil:
		s := resp.Secrets
		fmt.Fprintf(tw, "deliveries per signing secret since %s (%s)\n", ts(&s.Since), time.Duration(s.WindowSeconds*float64(time.Second)))
		if len(s.Secrets) == 0 {
			fmt.Fprintln(tw, "no deliveries in the window")
			return
		}
		fmt.Fprintln(tw, "ENDPOINT\tFINGERPRINT\tRECEIPTS\tFIRST\tLAST")
		for _, u := range s.Secrets {
			fp := u.Fingerprint
			if fp == "" {
				fp = "(not recorded)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", u.Endpoint, fp, u.Receipts, ts(&u.First), ts(&u.Last))
		}
		fmt.Fprintln(tw, "\nA secret whose fingerprint (inboxctl fingerprint < secret) is missing here matched nothing in the window.")
	}
}

func renderStatus(tw *tabwriter.Writer, s *ops.Status) {
	fmt.Fprintf(tw, "backlog\t%d\n", s.Backlog)
	fmt.Fprintf(tw, "oldest unprocessed\t%s\n", seconds(s.OldestUnprocessedAgeSeconds))
	fmt.Fprintf(tw, "needs review\t%d\t(at %d attempts)\n", s.NeedsReview, s.MaxAttempts)
	fmt.Fprintf(tw, "open anomalies\t%d\n", s.OpenAnomalies)
	fmt.Fprintf(tw, "outbox backlog\t%d\n", s.OutboxBacklog)
	fmt.Fprintf(tw, "oldest unpublished\t%s\n", seconds(s.OutboxOldestAgeSeconds))
	fmt.Fprintf(tw, "outbox waiting\t%d\t(at %d attempts; inboxctl outbox)\n", s.OutboxNeedsReview, s.OutboxMaxAttempts)
	h := s.LastHour
	share := 0.0
	if h.Receipts > 0 {
		share = 100 * float64(h.Duplicates) / float64(h.Receipts+h.Duplicates)
	}
	fmt.Fprintf(tw, "last hour\t%d receipts, %d duplicate deliveries (%.1f%%)\n", h.Receipts, h.Duplicates, share)
	fmt.Fprintf(tw, "receipt to effect\tp50 %s  p99 %s  max %s  (%d processed)\n", seconds(h.Latency.P50), seconds(h.Latency.P99), seconds(h.Latency.Max), h.Latency.Processed)
	if len(h.Sources) > 0 {
		fmt.Fprintln(tw, "\nSOURCE (last hour)\tRECEIPTS")
		for _, c := range h.Sources {
			fmt.Fprintf(tw, "%s\t%d\n", c.Source, c.Receipts)
		}
	}
	if len(h.Types) > 0 {
		fmt.Fprintln(tw, "\nTYPE (last hour)\tRECEIPTS\tDUPLICATES")
		for _, t := range h.Types {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", t.EventType, t.Receipts, t.Duplicates)
		}
	}
	if len(s.APIVersions) > 0 {
		fmt.Fprintln(tw, "\nENDPOINT\tAPI VERSION (last day)\tRECEIPTS\tLAST")
		for _, v := range s.APIVersions {
			name := v.APIVersion
			if name == "" {
				name = "(none)"
			}
			if !v.Expected {
				name += "  <- not " + s.ExpectedAPIVersion
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", v.Endpoint, name, v.Receipts, ts(&v.Last))
		}
	}
}

func renderReceipts(tw *tabwriter.Writer, p *ops.ReceiptPage, now time.Time) {
	if p.Count == 0 {
		fmt.Fprintln(tw, "no receipts match")
		return
	}
	fmt.Fprintln(tw, "RECEIVED\tENDPOINT\tEVENT\tTYPE\tSTATE\tATTEMPTS\tLAST ERROR")
	for _, r := range p.Receipts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", ts(&r.ReceivedAt), r.Endpoint, r.EventID, r.EventType, state(r), r.Attempts, oneLine(r.LastError, 60))
	}
	fmt.Fprintf(tw, "\n%d receipts", p.Count)
	if p.Next != "" {
		fmt.Fprintf(tw, "; next page: --after %s", p.Next)
	}
	fmt.Fprintln(tw)
}

func state(r inbox.Receipt) string {
	if r.State == inbox.StateProcessed {
		return r.Outcome
	}
	return r.State
}

func renderShow(tw *tabwriter.Writer, s *ops.Shown) {
	if s.AuditID != 0 {
		defer fmt.Fprintf(tw, "\npayload read recorded as audit row %d\n", s.AuditID)
	}
	for i, r := range s.Receipts {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "receipt\t%s on %s\n", r.EventID, r.Endpoint)
		available := ts(r.AvailableAt)
		if r.State == inbox.StateNeedsReview && r.AvailableAt == nil {
			available = "waits for review (inboxctl retry " + r.EventID + " --reason ...)"
		}
		for _, kv := range [][2]string{
			{"type", r.EventType}, {"state", state(r)}, {"attempts", fmt.Sprint(r.Attempts)},
			{"last error", r.LastError}, {"received", ts(&r.ReceivedAt)}, {"signed", ts(r.SignedAt)},
			{"available", available}, {"processed", ts(r.ProcessedAt)},
			{"api version", r.APIVersion}, {"livemode", fmt.Sprint(r.Livemode)}, {"account", r.Account},
			{"object", r.ObjectID}, {"source", source(r)}, {"secret", r.SecretFingerprint}, {"duplicates", fmt.Sprint(r.Duplicates)},
		} {
			if kv[1] != "" && kv[1] != "-" {
				fmt.Fprintf(tw, "  %s\t%s\n", kv[0], oneLine(kv[1], 200))
			}
		}
		if r.Payload != nil {
			fmt.Fprintf(tw, "  payload\t%s\n", string(r.Payload))
		} else if r.PayloadText != "" {
			fmt.Fprintf(tw, "  payload (not valid JSON text)\t%s\n", r.PayloadText)
		}
	}
	e := s.Effects
	fmt.Fprintln(tw, "\neffects")
	if len(e.Invoices)+len(e.Ledger)+len(e.Outbox)+len(e.Anomalies) == 0 {
		fmt.Fprintln(tw, "  none")
	}
	for _, i := range e.Invoices {
		fmt.Fprintf(tw, "  invoice %s\t%s, due %d, paid %d %s, customer %s, account %s\n", i.ID, i.Status, i.AmountDue, i.AmountPaid, i.Currency, i.CustomerID, accountOf(i.Account))
	}
	for _, l := range e.Ledger {
		fmt.Fprintf(tw, "  ledger %d\t%s %d %s under %s, account %s\n", l.ID, l.Kind, l.Amount, l.Currency, l.InvoiceID, accountOf(l.Account))
	}
	for _, o := range e.Outbox {
		fmt.Fprintf(tw, "  outbox %d\t%s %s %s, published %s\n", o.ID, o.EventType, o.AggregateType, o.AggregateID, ts(o.PublishedAt))
	}
	for _, a := range e.Anomalies {
		fmt.Fprintf(tw, "  anomaly %d\t%s of %s, account %s, resolved %s %s\n", a.ID, a.Kind, a.SubjectID, accountOf(a.Account), ts(a.ResolvedAt), a.Resolution)
	}
}

// accountOf names the account a business row belongs to: the connected
// account's id, or "platform" for the platform's own ("").
func accountOf(account string) string {
	if account == "" {
		return "platform"
	}
	return account
}

func renderRetry(tw *tabwriter.Writer, r *ops.RetryResult) {
	if r.DryRun {
		fmt.Fprintf(tw, "dry run: would retry %d receipts (nothing changed)\n", r.Count)
	} else {
		fmt.Fprintf(tw, "retried %d receipts\n", r.Count)
	}
	if len(r.Receipts) > 0 {
		fmt.Fprintln(tw, "ENDPOINT\tEVENT")
		for _, k := range r.Receipts {
			fmt.Fprintf(tw, "%s\t%s\n", k.Endpoint, k.EventID)
		}
	}
	if r.Truncated {
		fmt.Fprintf(tw, "(the first %d listed)\n", len(r.Receipts))
	}
	if r.SkippedCount > 0 {
		fmt.Fprintf(tw, "skipped %d receipts a worker holds right now (its lease, or a failure's backoff, has not ended); retry them after HELD UNTIL if they are still unprocessed\n", r.SkippedCount)
		fmt.Fprintln(tw, "ENDPOINT\tEVENT\tHELD UNTIL")
		for _, k := range r.Skipped {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", k.Endpoint, k.EventID, ts(&k.Until))
		}
		if r.SkippedTrunc {
			fmt.Fprintf(tw, "(the first %d listed)\n", len(r.Skipped))
		}
	}
	if r.AuditID != 0 {
		fmt.Fprintf(tw, "audit row %d\n", r.AuditID)
	}
}

func ts(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

func renderOutbox(tw *tabwriter.Writer, p *ops.OutboxPage) {
	if p.Count == 0 {
		if p.AllUnpublished {
			fmt.Fprintln(tw, "no unpublished outbox rows")
		} else {
			fmt.Fprintln(tw, "no outbox rows wait for a human")
		}
		return
	}
	fmt.Fprintln(tw, "ID\tEVENT TYPE\tAGGREGATE\tSTATE\tATTEMPTS\tNEXT ATTEMPT\tCREATED\tLAST ERROR")
	for _, r := range p.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%s %s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.EventType, r.AggregateType, r.AggregateID, r.State, r.Attempts, ts(r.AvailableAt), ts(&r.CreatedAt), oneLine(r.LastError, 60))
	}
	what := "outbox rows waiting for a human"
	if p.AllUnpublished {
		what = "unpublished outbox rows"
	}
	fmt.Fprintf(tw, "\n%d %s", p.Count, what)
	if p.Next != "" {
		fmt.Fprintf(tw, "; next page: --after %s", p.Next)
	}
	fmt.Fprintln(tw)
}

func renderOutboxRetry(tw *tabwriter.Writer, r *ops.OutboxRetryResult) {
	if r.DryRun {
		fmt.Fprintf(tw, "dry run: would retry %d outbox rows (nothing changed)\n", r.Count)
	} else {
		fmt.Fprintf(tw, "retried %d outbox rows: the relay publishes them on its next run\n", r.Count)
	}
	if len(r.IDs) > 0 {
		ids := make([]string, len(r.IDs))
		for i, id := range r.IDs {
			ids[i] = fmt.Sprint(id)
		}
		fmt.Fprintf(tw, "ids\t%s\n", strings.Join(ids, " "))
	}
	if r.Truncated {
		fmt.Fprintf(tw, "(the first %d listed)\n", len(r.IDs))
	}
	if r.AuditID != 0 {
		fmt.Fprintf(tw, "audit row %d\n", r.AuditID)
	}
}

// source says who stored a receipt, and when the reconciler listed it
// before the endpoint's delivery replaced its copy.
func source(r inbox.Receipt) string {
	if r.ListedFirst && r.Source == string(inbox.SourceWebhook) {
		return r.Source + " (the reconciler listed it first; the delivery replaced its copy)"
	}
	return r.Source
}

func renderWritebacks(tw *tabwriter.Writer, l *ops.WritebackList) {
	if l.Count == 0 {
		fmt.Fprintln(tw, "no write-backs wait for a human")
		return
	}
	fmt.Fprintln(tw, "ID\tKIND\tTARGET\tATTEMPTS\tFIRST ATTEMPT\tCREATED\tLAST ERROR")
	for _, r := range l.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Kind, r.Target, r.Attempts, ts(r.FirstAttemptAt), ts(&r.CreatedAt), oneLine(r.LastError, 60))
	}
	fmt.Fprintf(tw, "\n%d write-backs waiting for a human (inboxctl writeback ID shows one; writeback-retry ID --reason TEXT sends it again)\n", l.Count)
}

func renderWriteback(tw *tabwriter.Writer, d *writeback.Detail) {
	fmt.Fprintf(tw, "write-back\t%d\n", d.ID)
	fmt.Fprintf(tw, "kind\t%s\n", d.Kind)
	fmt.Fprintf(tw, "target\t%s\n", d.Target)
	fmt.Fprintf(tw, "params\t%s\n", d.Params)
	if d.KeyGeneration > 0 {
		fmt.Fprintf(tw, "idempotency key\t%s\t(generation %d of %s)\n", d.SentKey, d.KeyGeneration, d.IdempotencyKey)
	} else {
		fmt.Fprintf(tw, "idempotency key\t%s\n", d.SentKey)
	}
	fmt.Fprintf(tw, "booked by\t%s\n", d.EventID)
	fmt.Fprintf(tw, "status\t%s\n", d.Status)
	fmt.Fprintf(tw, "attempts\t%d\t(first %s, last %s)\n", d.Attempts, ts(d.FirstAttemptAt), ts(d.LastAttemptAt))
	if d.Status == "pending" {
		fmt.Fprintf(tw, "next attempt\t%s\n", ts(d.AvailableAt))
	}
	if d.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", oneLine(d.LastError, 200))
	}
	if d.Status == "done" {
		fmt.Fprintf(tw, "result\t%s %s at %s\n", d.ResultVia, d.ResultID, ts(d.DoneAt))
		fmt.Fprintf(tw, "answer\t%s\n", oneLine(string(d.Result), 200))
	}
}

func renderWritebackRetry(tw *tabwriter.Writer, r *ops.WritebackRetryResult) {
	if r.DryRun {
		fmt.Fprintf(tw, "dry run: would retry write-back %d (%s %s, %d attempts, last error: %s; nothing changed)\n",
			r.Intent.ID, r.Intent.Kind, r.Intent.Target, r.Intent.Attempts, oneLine(r.Intent.LastError, 80))
		return
	}
	fmt.Fprintf(tw, "retried write-back %d: the sender sends it on its next run\n", r.Intent.ID)
	if r.AuditID != 0 {
		fmt.Fprintf(tw, "audit row %d\n", r.AuditID)
	}
}
