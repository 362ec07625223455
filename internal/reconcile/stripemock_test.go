package reconcile_test

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/reconcile"
	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// startStripeMock installs the pinned stripe-mock (scripts/lib/stripemock.sh)
// and runs it on ports the kernel picks; it returns its HTTP base URL.
func startStripeMock(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	var stderr bytes.Buffer
	install := exec.Command("bash", "-c", ". scripts/lib/stripemock.sh && stripemock_install")
	install.Dir = root
	install.Stderr = &stderr
	out, err := install.Output()
	require.NoError(t, err, "installing stripe-mock: %s", stderr.String())
	bin := strings.TrimSpace(string(out))

	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	pipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// It says where it listens once it does.
	listening := regexp.MustCompile(`Listening for HTTP at address: (\S+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case addr := <-found:
		return "http://" + addr
	case <-time.After(60 * time.Second): // a bound on a hang, not an expectation of speed
		t.Fatal("stripe-mock never said it was listening")
		return ""
	}
}

// The client decodes what stripe-mock, which answers from Stripe's own
// OpenAPI specification, returns for GET /v1/events with the reconciler's
// parameters (types[], created range, limit), and the store accepts the
// events: the shapes are Stripe's.
func TestClientDecodesStripeMockEvents(t *testing.T) {
	t.Parallel()
	base := startStripeMock(t)
	client, err := reconcile.NewClient(reconcile.ClientConfig{Key: "sk_test_123", BaseURL: base, Rate: 100, MaxAttempts: 1})
	require.NoError(t, err)
	page, err := client.ListPage(context.Background(), reconcile.Query{
		Types: handlerTypes(), Since: now.Add(-72 * time.Hour), Until: now, Limit: 100,
	})
	require.NoError(t, err)
	require.NotEmpty(t, page.Events)
	for _, raw := range page.Events {
		ev, err := stripeevent.Parse(raw)
		require.NoError(t, err, "%s", raw)
		require.True(t, strings.HasPrefix(ev.ID, "evt_"), ev.ID)
		require.NotEmpty(t, ev.Type)
	}

	// Stored like any page.
	b := setup(t)
	c, err := reconcile.DBSink{DB: b.db.Pool}.StorePage(context.Background(), "billing", page.Events)
	require.NoError(t, err)
	require.Equal(t, len(page.Events), c.Stored+c.AlreadyPresent)
	require.Positive(t, c.Stored)

}
