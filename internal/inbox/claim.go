package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Claimed is a receipt the caller holds a lease on.
type Claimed struct {
	Key
	EventType string
	// LockKey is the invoice the event belongs to, as far as the claim
	// could tell (lockKey in queries.go): the order a batch applies its
	// receipts in.
	LockKey  string
	Attempts int // including this one
	// APIVersion is the event's api_version ("" when it has none), and
	// Source who stored it: the worker counts deliveries of versions its
	// handlers were not written for.
	APIVersion string
	Source     Source
	// LeaseUntil is when the claim's lease ends (the available_at the
	// claim set). With Attempts it fences the claim's release.
	LeaseUntil time.Time
}

// ClaimParams bound a claim.
type ClaimParams struct {
	Now         *time.Time // nil: the database's now()
	MaxAttempts int
	Limit       int
	Lease       time.Duration
	// StatementTimeout, when positive, bounds the claim on the server
	// (statement_timeout for its own transaction only): a claim that waits
	// on a lock (say a migration's ACCESS EXCLUSIVE lock on webhook_inbox)
	// fails with SQLSTATE 57014 after it and claims nothing, and the
	// connection stays usable. Cancelling the context instead closes the
	// connection and leaves the server's session waiting on the lock.
	StatementTimeout time.Duration
}

// Claim takes up to p.Limit claimable receipts in one short statement that
// commits on its own: each one's attempt is counted and it is hidden from
// other claims for the lease. Its commit does not wait for the WAL flush
// (claimLocals): see there why a claim lost in a crash of the server is
// harmless. db must not be in a transaction: the claim's settings are its
// own transaction's (set_config local), and would last to the end of the
// caller's.
func Claim(ctx context.Context, db BatchDB, p ClaimParams) ([]Claimed, error) {
	var out []Claimed
	err := queryAfter(ctx, db, claimLocals(p.StatementTimeout), func(rows pgx.Rows) (err error) {
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claimed, error) {
			var c Claimed
			err := r.Scan(&c.Provider, &c.Endpoint, &c.EventID, &c.EventType, &c.Attempts, &c.APIVersion, &c.Source, &c.LeaseUntil, &c.LockKey)
			return c, err
		})
		return err
	}, claimSQL(p.Limit), p.Now, p.MaxAttempts, p.Lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("claiming receipts: %w", err)
	}
	return out, nil
}

// BatchDB is a DB that can also send a pipeline of statements (a pool or a
// connection): what a statement bounded by a statement timeout needs.
type BatchDB interface {
	DB
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// claimLocals is what a claim's transaction sets for itself: the statement
// timeout (when positive), synchronous_commit off and a generic plan.
//
// synchronous_commit = off for the claim only (issue 24): its commit
// returns without waiting for the WAL flush, which the WAL writer does
// within a few wal_writer_delay (200 ms by default); one flush fewer per
// claim. It is safe because a claim lost that way is harmless:
//   - only a crash of the server (or its host) loses it; a worker that dies
//     loses nothing, the server still flushes the claim;
//   - a lost claim leaves the receipts as they were before it: claimable,
//     attempt uncounted, as a release (ReleaseKeys) leaves them. No money
//     moves with a claim: the effect commits in the processing transaction,
//     which locks the receipt and re-checks processed_at, so a receipt
//     claimed again is applied once;
//   - a processing transaction that committed (synchronously, the default)
//     flushed the WAL up to its commit record, the claim's included (WAL is
//     flushed in order): no effect is ever durable without its claim.
//
// What is given up: a receipt that crashes the database server itself
// within that flush delay of its claim would not use up its attempts. The
// attempt limit is for receipts that kill workers (a panic, a timeout, a
// process that dies), which lose nothing here.
// PostgreSQL: "synchronous_commit can be changed per transaction ... with
// SET LOCAL"; an asynchronous commit risks "the most recent transactions"
// in a server crash, never consistency
// (https://www.postgresql.org/docs/current/wal-async-commit.html).
//
// plan_cache_mode = force_generic_plan for the claim only (issue 24): the
// worker's connections prepare the claim once, but PostgreSQL planned it
// again on every execution: the plan cache moves to the generic plan only
// once the custom plans' average estimated cost, planning included, is
// above the generic plan's (https://www.postgresql.org/docs/15/sql-prepare.html,
// Notes), and the generic plan's estimate (available_at against a
// parameter) never came below a custom plan's. Planning took a fifth of
// the claim's server time (pg_stat_statements, invoice-only drain: 456 of
// about 2,400 µs per claim). The generic plan is safe because the limit is
// in the claim's text (claimReceipts): the plan PostgreSQL keeps is the
// partial index webhook_inbox_unprocessed in available_at order under the
// LIMIT, then the primary key, whatever the backlog
// (TestClaimGenericPlanIsCostedForItsLimit,
// TestClaimDoesNotReadNeedsReviewRows). On a connection that does not
// prepare statements (QueryExecModeExec: the unnamed statement), each
// execution is parsed and planned anyway, now into the generic plan; the
// worker always prepares (internal/database).
func claimLocals(timeout time.Duration) []queued {
	q := []queued{{sql: setClaimLocals}}
	if timeout > 0 {
		q = append(q, queued{sql: setLocalStatementTimeout, args: []any{fmt.Sprintf("%dms", max(timeout.Milliseconds(), 1))}}) // 0 would mean none
	}
	return q
}

// queued is a statement sent ahead of another in one pipeline (queryAfter).
type queued struct {
	sql  string
	args []any
	what string // what it does, for an error ("" when the caller says)
}

// queryWithin runs sql and hands its rows to read. With a positive timeout
// it runs under that statement_timeout, set for its transaction only, in
// one round trip: set_config(..., is_local) and sql go in one pipeline,
// which PostgreSQL runs as one implicit transaction. The server cancels a
// statement that runs (or waits on a lock) longer, and the connection stays
// usable; nothing else on the connection is affected.
func queryWithin(ctx context.Context, db BatchDB, timeout time.Duration, read func(pgx.Rows) error, sql string, args ...any) error {
	var before []queued
	if timeout > 0 {
		before = append(before, queued{sql: setLocalStatementTimeout, args: []any{fmt.Sprintf("%dms", max(timeout.Milliseconds(), 1))}}) // 0 would mean none
	}
	return queryAfter(ctx, db, before, read, sql, args...)
}

// queryAfter runs the statements of before, then sql, in one pipeline (one
// round trip; one implicit transaction, unless one of them is BEGIN, which
// opens a transaction that outlasts it), and hands sql's rows to read.
func queryAfter(ctx context.Context, db BatchDB, before []queued, read func(pgx.Rows) error, sql string, args ...any) error {
	if len(before) == 0 {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		return read(rows)
	}
	b := &pgx.Batch{}
	for _, q := range before {
		b.Queue(q.sql, q.args...)
	}
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	for _, q := range before {
		if _, err := br.Exec(); err != nil {
			br.Close()
			if q.what != "" {
				return fmt.Errorf("%s: %w", q.what, err)
			}
			return err
		}
	}
	rows, err := br.Query()
	if err == nil {
		err = read(rows)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Locked is a receipt locked for processing.
type Locked struct {
	EventType string
	Payload   []byte
	Livemode  bool   // the event's livemode
	Account   string // the connected account (acct_...), "" for the platform's own events
}

// Lock locks k's row in tx, waiting for a concurrent holder. found is false
// when the row is already processed (another worker completed it).
func Lock(ctx context.Context, tx DB, k Key) (Locked, bool, error) {
	var l Locked
	var payload []byte
	err := tx.QueryRow(ctx, lockReceipt, k.Provider, k.Endpoint, k.EventID).Scan(&l.EventType, &payload, &l.Livemode, &l.Account)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Locked{}, false, nil
	case err != nil:
		return Locked{}, false, fmt.Errorf("locking receipt %s: %w", k.EventID, err)
	}
	l.Payload = payload
	return l, true, nil
}

// MarkProcessed sets processed_at and the outcome in tx, and returns the
// receipt-to-effect latency (processed_at - received_at).
func MarkProcessed(ctx context.Context, tx DB, k Key, outcome string, now *time.Time) (time.Duration, error) {
	var seconds float64
	err := tx.QueryRow(ctx, markProcessed, k.Provider, k.Endpoint, k.EventID, outcome, now).Scan(&seconds)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("marking receipt %s processed: 0 rows matched", k.EventID)
	case err != nil:
		return 0, fmt.Errorf("marking receipt %s processed: %w", k.EventID, err)
	}
	return seconds2duration(seconds), nil
}

func seconds2duration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// RecordFailure stores the error and makes the row claimable again after
// delay, unless another worker has completed it meanwhile. A row that has
// used up maxAttempts is not claimable again: it waits for review, out of
// the claim's way.
func RecordFailure(ctx context.Context, db DB, k Key, errText string, delay time.Duration, now *time.Time, maxAttempts int) error {
	if _, err := db.Exec(ctx, recordFailure, k.Provider, k.Endpoint, k.EventID, errText, now, delay.Milliseconds(), maxAttempts); err != nil {
		return fmt.Errorf("recording failure of receipt %s: %w", k.EventID, err)
	}
	return nil
}

// Release gives back claimed receipts that were not attempted, and returns
// how many it gave back. It releases only a claim that is still the
// caller's: the attempt count and lease end the claim returned are the
// fencing token. Once the lease has expired another worker may have
// claimed the receipt again, or an operator retried it and another worker
// claimed it; that claim is left alone.
func Release(ctx context.Context, db DB, claims []Claimed, now *time.Time) (int, error) {
	released, err := ReleaseKeys(ctx, db, claims, now)
	return len(released), err
}

// ReleaseKeys is Release, and returns the keys of the receipts it gave
// back.
func ReleaseKeys(ctx context.Context, db DB, claims []Claimed, now *time.Time) ([]Key, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	keys := make([]Key, len(claims))
	attempts := make([]int32, len(claims))
	leases := make([]time.Time, len(claims))
	for i, c := range claims {
		keys[i], attempts[i], leases[i] = c.Key, int32(c.Attempts), c.LeaseUntil
	}
	ps, es, ids := keyArrays(keys)
	rows, err := db.Query(ctx, releaseClaims, ps, es, ids, attempts, now, leases)
	if err != nil {
		return nil, fmt.Errorf("releasing %d claims: %w", len(claims), err)
	}
	released, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		var k Key
		err := r.Scan(&k.Provider, &k.Endpoint, &k.EventID)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("releasing %d claims: %w", len(claims), err)
	}
	return released, nil
}

// ParkNeedsReview moves the unprocessed receipts that used up maxAttempts
// but are still in the claim's range out of it (see parkNeedsReview), and
// returns how many it moved: receipts whose last attempt's lease ended
// without an outcome, that reached the limit before, or whose limit was
// lowered. Failures park receipts as they reach the limit. now nil: the
// database's now().
func ParkNeedsReview(ctx context.Context, db DB, maxAttempts int, now *time.Time) (int, error) {
	tag, err := db.Exec(ctx, parkNeedsReview, maxAttempts, now)
	if err != nil {
		return 0, fmt.Errorf("parking receipts that need review: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Backlog describes the unprocessed receipts.
type Backlog struct {
	Count            int     // unprocessed and still claimable by attempts
	OldestAgeSeconds float64 // age of the oldest of those; 0 when none
	NeedsReview      int     // unprocessed with attempts at the limit
}

// Stats reads the backlog.
func Stats(ctx context.Context, db DB, maxAttempts int, now *time.Time) (Backlog, error) {
	var b Backlog
	if err := db.QueryRow(ctx, backlogStats, maxAttempts, now).Scan(&b.Count, &b.OldestAgeSeconds, &b.NeedsReview); err != nil {
		return Backlog{}, fmt.Errorf("reading backlog: %w", err)
	}
	return b, nil
}

func keyArrays(keys []Key) (ps, es, ids []string) {
	ps, es, ids = make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ps[i], es[i], ids[i] = k.Provider, k.Endpoint, k.EventID
	}
	return ps, es, ids
}

// LockMany locks the given receipts in tx (waiting for concurrent holders)
// and returns those still unprocessed; a key missing from the result was
// completed by another worker.
func LockMany(ctx context.Context, tx DB, keys []Key) (map[Key]Locked, error) {
	ps, es, ids := keyArrays(keys)
	rows, err := tx.Query(ctx, lockReceipts, ps, es, ids)
	var out map[Key]Locked
	if err == nil {
		out, err = readLocked(rows, len(keys))
	}
	if err != nil {
		return nil, fmt.Errorf("locking %d receipts: %w", len(keys), err)
	}
	return out, nil
}

// BeginLockMany opens a transaction on conn, bounds it by the timeouts
// (as SetLocalTimeouts) and locks keys in it (as LockMany), in one round
// trip: BEGIN, set_config and the lock go in one pipeline, which the
// server runs in order, stopping at the first error (issue 24: three round
// trips were two fifths of a small batch's). The transaction stays open on
// conn until the caller sends COMMIT or ROLLBACK, on success or failure
// alike (conn.PgConn().TxStatus() says whether one is open).
func BeginLockMany(ctx context.Context, conn BatchDB, keys []Key, statement, lock time.Duration) (map[Key]Locked, error) {
	ps, es, ids := keyArrays(keys)
	var out map[Key]Locked
	err := queryAfter(ctx, conn, []queued{{sql: "BEGIN", what: "beginning transaction"}, localTimeouts(statement, lock)},
		func(rows pgx.Rows) (err error) {
			out, err = readLocked(rows, len(keys))
			return err
		}, lockReceipts, ps, es, ids)
	if err != nil {
		return nil, fmt.Errorf("locking %d receipts: %w", len(keys), err)
	}
	return out, nil
}

// readLocked reads lockReceipts' rows.
func readLocked(rows pgx.Rows, n int) (map[Key]Locked, error) {
	defer rows.Close()
	out := make(map[Key]Locked, n)
	for rows.Next() {
		var k Key
		var l Locked
		var payload []byte
		if err := rows.Scan(&k.Provider, &k.Endpoint, &k.EventID, &l.EventType, &payload, &l.Livemode, &l.Account); err != nil {
			return nil, err
		}
		l.Payload = payload
		out[k] = l
	}
	return out, rows.Err()
}

// MarkManyProcessed sets processed_at and each receipt's outcome in tx, and
// returns the receipt-to-effect latencies (processed_at - received_at), in
// no particular order. It fails, and marks nothing, unless every key is
// unprocessed (locked by tx, LockMany).
func MarkManyProcessed(ctx context.Context, tx DB, keys []Key, outcomes []string, now *time.Time) ([]time.Duration, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	ps, es, ids := keyArrays(keys)
	rows, err := tx.Query(ctx, markManyProcessed, ps, es, ids, outcomes, now)
	if err != nil {
		return nil, fmt.Errorf("marking %d receipts processed: %w", len(keys), err)
	}
	lat, err := collectLatencies(rows)
	if err != nil {
		return nil, fmt.Errorf("marking %d receipts processed: %w", len(keys), err)
	}
	return lat, nil
}

// MarkManyProcessedCommit is MarkManyProcessed followed by COMMIT of the
// transaction db is in, in one round trip (one pipeline; issue 24). The
// server runs COMMIT only when the mark succeeded, and the mark fails
// unless it marked every key (markManyProcessed): a mark that missed a
// receipt never commits. committed is true when COMMIT ran and committed;
// false means not known to have committed (a connection lost after the
// pipeline was sent may have committed it: the caller's fallback re-locks
// and re-checks each receipt).
func MarkManyProcessedCommit(ctx context.Context, db BatchDB, keys []Key, outcomes []string, now *time.Time) (lat []time.Duration, committed bool, err error) {
	b := &pgx.Batch{}
	if len(keys) > 0 {
		ps, es, ids := keyArrays(keys)
		b.Queue(markManyProcessed, ps, es, ids, outcomes, now)
	}
	b.Queue("COMMIT")
	br := db.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && !committed && cerr != nil {
			err = fmt.Errorf("committing: %w", cerr)
		}
	}()
	if len(keys) > 0 {
		rows, err := br.Query()
		if err == nil {
			lat, err = collectLatencies(rows)
		}
		if err != nil {
			return nil, false, fmt.Errorf("marking %d receipts processed: %w", len(keys), err)
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		// PostgreSQL answers COMMIT of a failed transaction with ROLLBACK.
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return nil, false, fmt.Errorf("committing: %w", err)
	}
	return lat, true, nil
}

// collectLatencies reads markManyProcessed's rows.
func collectLatencies(rows pgx.Rows) ([]time.Duration, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (time.Duration, error) {
		var s float64
		err := r.Scan(&s)
		return seconds2duration(s), err
	})
}

// Claimable reports whether a claim would find a receipt now: the resident
// worker's poll while the inbox is empty (an index probe; no lock, no
// write). A positive timeout bounds it on the server, as
// ClaimParams.StatementTimeout bounds a claim.
func Claimable(ctx context.Context, db BatchDB, maxAttempts int, now *time.Time, timeout time.Duration) (bool, error) {
	var ok bool
	err := queryWithin(ctx, db, timeout, func(rows pgx.Rows) (err error) {
		ok, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
		return err
	}, claimable, now, maxAttempts)
	if err != nil {
		return false, fmt.Errorf("polling for receipts: %w", err)
	}
	return ok, nil
}

// Listen registers conn for the notification a stored receipt sends when
// the webhook notifies (StoreAndNotify). conn must be a connection of its
// own for as long as it listens.
func Listen(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, listenReceipts); err != nil {
		return fmt.Errorf("listening for receipts: %w", err)
	}
	return nil
}
