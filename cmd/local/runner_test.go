package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/config/configtest"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// freeAddr is a loopback address nothing listens on (the runner's
// LISTEN_ADDR).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// loadLocal reads env, with LISTEN_ADDR set to addr, as the runner does.
func loadLocal(t *testing.T, addr string, env map[string]string) config.Local {
	t.Helper()
	env["LISTEN_ADDR"] = addr
	cfg, err := config.LoadLocal(configtest.MapEnv(env))
	require.NoError(t, err)
	return cfg
}

// runUntilCleanup runs the local runner with cfg until the test ends; it
// must then stop cleanly.
func runUntilCleanup(t *testing.T, cfg config.Local) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "the runner stops cleanly when cancelled")
	})
}

// startRunner runs the local runner with cfg until the test ends (it must
// then stop cleanly) and returns a function that delivers a payload to its
// webhook at addr, signed with whsec_test, once it listens.
func startRunner(t *testing.T, cfg config.Local, addr string) (deliver func(payload []byte)) {
	t.Helper()
	runUntilCleanup(t, cfg)
	return func(payload []byte) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/billing", bytes.NewReader(payload))
			require.NoError(t, err)
			req.Header.Set("Stripe-Signature", stripetest.Sign(payload, time.Now(), "whsec_test"))
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				_ = res.Body.Close()
				require.Equal(t, http.StatusOK, res.StatusCode)
				return
			}
			require.True(t, time.Now().Before(deadline), "the webhook never listened: %v", err)
			time.Sleep(10 * time.Millisecond) // waiting for the listener, not for time to pass
		}
	}
}
