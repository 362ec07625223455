// Command inboxctl operates the inbox without SQL: status, receipts, show,
// retry, anomalies, resolve, secrets, and the outbox rows that wait for a
// human (outbox, outbox-retry). Locally it reads DATABASE_URL; with
// --stage NAME it invokes that stage's ops function with the caller's AWS
// credentials. See internal/opscli and inboxctl help.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/stripe-inbox/inbox/internal/opscli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := opscli.Main(ctx, os.Args[1:], opscli.IO{Env: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}
