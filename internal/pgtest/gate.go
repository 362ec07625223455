package pgtest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Gate holds the server's answers on the wire: while it is closed, the
// connections of a GatedPool read nothing (their reads wait), so a test can
// make a statement's answer arrive after the server committed it (after
// its context ended, say) without a sleep or a flag in production code.
type Gate struct {
	mu     sync.Mutex
	closed bool
	opened chan struct{}
	// deadline is signalled when the client sets a deadline on a
	// connection while the gate is closed: how pgx ends a statement whose
	// context ended (pgconn.DeadlineContextWatcherHandler).
	deadline chan struct{}
}

// Close holds every read from now on, until Open.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed, g.opened = true, make(chan struct{})
	}
}

// OpenOnDeadline opens the gate once the client has set a deadline on a
// held connection (pgx ending a statement on a context that ended), or
// after grace when it does not: a test that cancels a context the held
// statement should not be running on opens the gate with it, so that the
// answer meets a client that reacted to the cancellation, if it does.
// Whether the test passes never depends on grace; only how surely it
// catches a statement run on the wrong context does.
func (g *Gate) OpenOnDeadline(grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-g.deadline:
	case <-t.C:
	}
	g.Open()
}

// Open lets the held reads go on.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.opened)
	}
}

func (g *Gate) wait() {
	g.mu.Lock()
	closed, opened := g.closed, g.opened
	g.mu.Unlock()
	if closed {
		<-opened
	}
}

// GatedPool is a pool of at most maxConns connections to the test database
// whose reads wait while the returned gate is closed. Its connections are
// open (and the gate open) when it returns; it is closed when the test
// ends.
func (d *Database) GatedPool(t testing.TB, maxConns int32) (*pgxpool.Pool, *Gate) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = maxConns
	// No liveness ping when a connection is acquired (pgxpool pings one
	// idle for over a second): its answer would wait at a closed gate.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	g := &Gate{deadline: make(chan struct{}, 1)}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gatedConn{Conn: c, gate: g}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		g.Open()
		pool.Close()
	})
	conns := make([]*pgxpool.Conn, maxConns)
	for i := range conns {
		if conns[i], err = pool.Acquire(context.Background()); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	return pool, g
}

// gatedConn is a connection whose reads wait while its gate is closed.
type gatedConn struct {
	net.Conn
	gate *Gate
}

func (c *gatedConn) Read(p []byte) (int, error) {
	c.gate.wait()
	return c.Conn.Read(p)
}

func (c *gatedConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	c.gate.mu.Lock()
	closed := c.gate.closed
	c.gate.mu.Unlock()
	if closed && !t.IsZero() {
		select {
		case c.gate.deadline <- struct{}{}:
		default:
		}
	}
	return err
}
