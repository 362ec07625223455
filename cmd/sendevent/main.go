// Command sendevent signs a sample Stripe event with a webhook signing secret
// and POSTs it to the local runner, as Stripe would:
//
//	go run ./cmd/sendevent -type invoice.paid -invoice in_123 -amount 2000
//
// It prints the response and exits non-zero unless the answer is 2xx.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

func main() {
	url := flag.String("url", "", "where to POST (default http://$LISTEN_ADDR/$WEBHOOK_ENDPOINT)")
	secret := flag.String("secret", os.Getenv("STRIPE_WEBHOOK_SECRET"), "signing secret (default $STRIPE_WEBHOOK_SECRET; the first of a comma list)")
	typ := flag.String("type", "invoice.paid", "event type: invoice.created, invoice.finalized, invoice.paid, invoice.voided, invoice.marked_uncollectible")
	id := flag.String("id", "", "event id (default a new evt_ id; repeat one to send a duplicate)")
	invoice := flag.String("invoice", "in_local_1", "invoice id")
	amount := flag.Int64("amount", 2000, "amount in minor units")
	flag.Parse()

	if *url == "" {
		addr := envOr("LISTEN_ADDR", "127.0.0.1:8080")
		*url = "http://" + addr + "/" + envOr("WEBHOOK_ENDPOINT", "billing")
	}
	first, _, _ := strings.Cut(*secret, ",")
	if !strings.HasPrefix(first, "whsec_") {
		fmt.Fprintln(os.Stderr, "set -secret or STRIPE_WEBHOOK_SECRET to the runner's signing secret (whsec_...)")
		os.Exit(2)
	}
	if *id == "" {
		*id = fmt.Sprintf("evt_local_%d", time.Now().UnixNano())
	}
	status := map[string]string{
		"invoice.created": "draft", "invoice.finalized": "open", "invoice.paid": "paid",
		"invoice.voided": "void", "invoice.marked_uncollectible": "uncollectible",
	}[*typ]
	if status == "" {
		status = "open"
	}
	body := stripetest.Event(*id, *typ, stripetest.Invoice(*invoice, "cus_local", status, *amount))
	req, err := http.NewRequest(http.MethodPost, *url, bytes.NewReader(body))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Stripe-Signature", stripetest.Sign(body, time.Now(), first))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	fmt.Printf("%s %s -> %d %s\n", *id, *typ, resp.StatusCode, strings.TrimSpace(string(out)))
	if resp.StatusCode/100 != 2 {
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
