package batch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/batch"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// testBundle is a database with a table of counters (one row per job key,
// n = how many times the job's statements took effect) and a connection
// that counts its round trips (the times the client wrote to the server and
// then waited: every write of pgx's ends with a Sync or a simple query).
type testBundle struct {
	db         *pgtest.Database
	conn       *pgx.Conn
	writes     *atomic.Int64
	savepoints *savepointCounter // SAVEPOINT statements sent on conn
}

// savepointCounter is a pgx tracer that counts the SAVEPOINT statements a
// connection sends, alone or in a pipeline.
type savepointCounter struct{ n atomic.Int64 }

func (s *savepointCounter) count(sql string) {
	if strings.HasPrefix(sql, "SAVEPOINT ") {
		s.n.Add(1)
	}
}

func (s *savepointCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.count(d.SQL)
	return ctx
}

func (s *savepointCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *savepointCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		s.count(q.SQL)
	}
	return ctx
}

func (s *savepointCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (s *savepointCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func setup(t *testing.T) *testBundle {
	t.Helper()
	// No statement cache: a statement seen for the first time would cost a
	// round trip of its own to prepare.
	return setupMode(t, pgx.QueryExecModeExec)
}

// setupMode is setup with the connection's query mode: the worker's
// connections cache every statement they prepare (QueryExecModeCacheStatement,
// internal/database), and pgx prepares a batch's new statements in a round
// trip of its own, before the batch.
func setupMode(t *testing.T, mode pgx.QueryExecMode) *testBundle {
	t.Helper()
	db := pgtest.DB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE counters (k int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "CREATE TABLE statement_log (id bigserial PRIMARY KEY, job int NOT NULL, stmt int NOT NULL)")
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	writes := &atomic.Int64{}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes}, nil
	}
	cfg.DefaultQueryExecMode = mode
	savepoints := &savepointCounter{}
	cfg.Tracer = savepoints
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &testBundle{db: db, conn: conn, writes: writes, savepoints: savepoints}
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// run runs jobs in one transaction with batch.Run and commits (or rolls
// back when Run fails). It returns what Run returned and the round trips
// Run made.
func (b *testBundle) run(t *testing.T, ctx context.Context, jobs []batch.Job, more func() bool) (int, []error, error, int64) {
	t.Helper()
	return b.runClasses(t, ctx, jobs, batch.Classes{}, more)
}

// runClasses is run with batch.RunClasses.
func (b *testBundle) runClasses(t *testing.T, ctx context.Context, jobs []batch.Job, c batch.Classes, more func() bool) (int, []error, error, int64) {
	t.Helper()
	tx, err := b.conn.Begin(ctx)
	require.NoError(t, err)
	before := b.writes.Load()
	n, errs, err := batch.RunClasses(ctx, tx, jobs, c, more)
	trips := b.writes.Load() - before
	if err != nil {
		require.NoError(t, tx.Rollback(context.Background()))
		return n, errs, err, trips
	}
	require.NoError(t, tx.Commit(ctx))
	return n, errs, nil, trips
}

// bump is a job of statements statements, each adding 1 to counter k (so
// counter k ends at statements when they all took effect once), that then
// returns fail.
func bump(k, statements int, fail error) batch.Job {
	return func(ctx context.Context, db batch.DB) error {
		for range statements {
			if _, err := db.Exec(ctx, "INSERT INTO counters (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = counters.n + 1", k); err != nil {
				return err
			}
		}
		return fail
	}
}

// failing is a job whose first statement fails on the server.
func failing(ctx context.Context, db batch.DB) error {
	_, err := db.Exec(ctx, "SELECT 1 / 0")
	return err
}

// bumpOn is bump whose calls run under ctx, whatever context Run gives
// the job.
func bumpOn(ctx context.Context, k, statements int) batch.Job {
	return func(_ context.Context, db batch.DB) error { return bump(k, statements, nil)(ctx, db) }
}

// queryAfterUnsentCall is a job whose first statement (under ctx) adds 1
// to counter k, whose second (under ctx too, done by then) must be answered
// with ctx's error without being sent, and which then reads the ints query
// returns, under the job's own context, into got.
func queryAfterUnsentCall(ctx context.Context, k int, query string, got *[]int) batch.Job {
	return func(jobCtx context.Context, db batch.DB) error {
		if err := bump(k, 1, nil)(ctx, db); err != nil {
			return err
		}
		if _, err := db.Exec(ctx, "INSERT INTO counters (k, n) VALUES (20, 1)"); !errors.Is(err, context.Canceled) {
			return fmt.Errorf("the second call: %v, want the context's error", err)
		}
		rows, err := db.Query(jobCtx, query)
		if err != nil {
			return err
		}
		*got, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err
	}
}

// moreUntil is a more for Run that says no at its stop-th call (the wave
// so far is sent, its last job carried when it wants a second statement)
// and calls cancel at the call after.
func moreUntil(stop int, cancel context.CancelFunc) func() bool {
	asked := 0
	return func() bool {
		asked++
		switch asked {
		case stop:
			return false
		case stop + 1:
			cancel()
		}
		return true
	}
}

// bumpThenFail is bump whose job then makes a statement that fails on the
// server (in a pipeline, it stops the rest), and returns its error.
func bumpThenFail(k, statements int) batch.Job {
	return func(ctx context.Context, db batch.DB) error {
		if err := bump(k, statements, nil)(ctx, db); err != nil {
			return err
		}
		_, err := db.Exec(ctx, "SELECT 1 / (n - n) FROM counters WHERE k = $1", k)
		if err == nil {
			_, err = db.Exec(ctx, "SELECT 1 / 0")
		}
		return err
	}
}

func (b *testBundle) counter(t *testing.T, k int) int {
	t.Helper()
	var n int
	err := b.db.Pool.QueryRow(context.Background(), "SELECT n FROM counters WHERE k = $1", k).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return n
}

func TestJobsOfOneStatementShareOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var jobs []batch.Job
	for k := range 20 {
		jobs = append(jobs, bump(k, 1, nil))
	}
	n, errs, err, trips := b.run(t, context.Background(), jobs, nil)
	require.NoError(t, err)
	require.Equal(t, 20, n)
	require.Equal(t, make([]error, 20), errs)
	require.EqualValues(t, 1, trips, "20 savepoints and 20 statements in one pipeline")
	for k := range 20 {
		require.Equal(t, 1, b.counter(t, k))
	}
}

func TestAJobOfSeveralStatementsCutsTheWaveAndNothingIsAppliedTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Job 2 needs three statements: the jobs after it in the first wave are
	// rolled back and sent again, so each counter must end at its job's
	// statement count exactly. Its class not known, job 2 sends its second
	// statement after the rollback of jobs 3-5, with them (they run
	// again), wants a third there and so cuts that wave too: its third
	// statement goes in the round trip of the second rollback. Jobs 3-5 go
	// again in two waves (the size halved after each cut): five round
	// trips, as before issue 24, when the first rollback and each further
	// statement went alone.
	counts := []int{1, 1, 3, 1, 1, 1}
	var jobs []batch.Job
	for k, c := range counts {
		jobs = append(jobs, bump(k, c, nil))
	}
	n, errs, err, trips := b.run(t, context.Background(), jobs, nil)
	require.NoError(t, err)
	require.Equal(t, len(counts), n)
	require.Equal(t, make([]error, len(counts)), errs)
	require.EqualValues(t, 5, trips)
	for k, c := range counts {
		require.Equal(t, c, b.counter(t, k), "counter %d", k)
	}
}

// A class whose jobs took several statements ends the wave it is in, once
// Shapes has seen it: the job's further statements run after the wave, and
// nothing after it is rolled back and sent again. The same jobs cost one
// round trip fewer, and each counter still ends at its job's statements.
func TestAClassThatTookSeveralStatementsEndsItsWave(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counts := []int{1, 1, 3, 1, 1, 1}
	classes := []string{"one", "one", "three", "one", "one", "one"}
	jobs := func(base int) []batch.Job {
		var jobs []batch.Job
		for k, c := range counts {
			jobs = append(jobs, bump(base+k, c, nil))
		}
		return jobs
	}
	runClasses := func(jobs []batch.Job, c batch.Classes) int64 {
		n, errs, err, trips := b.runClasses(t, context.Background(), jobs, c, nil)
		require.NoError(t, err)
		require.Equal(t, len(jobs), n)
		require.Equal(t, make([]error, len(jobs)), errs)
		return trips
	}
	var shapes batch.Shapes
	// Unknown classes: one wave of six, cut at job 2; then the rollback of
	// jobs 3-5, job 2's second statement and jobs 3-5 again, where job 2
	// wants a third and cuts that wave too; its third statement with the
	// second rollback; then jobs 3-5 in the waves left (halved).
	require.EqualValues(t, 5, runClasses(jobs(0), batch.Classes{Of: classes, Shapes: &shapes}))
	// Learned: jobs 0-2; job 2's second statement alone (it is expected
	// to want a third: nothing after it may run before); its third with
	// jobs 3-5.
	require.EqualValues(t, 3, runClasses(jobs(10), batch.Classes{Of: classes, Shapes: &shapes}))
	for _, base := range []int{0, 10} {
		for k, c := range counts {
			require.Equal(t, c, b.counter(t, base+k), "counter %d", base+k)
		}
	}
}

// A job of two statements sends its second with the next wave, ahead of
// the first statements of the jobs after it. When its class is not known
// to take two, its first wave went on past it: the next wave first rolls
// those jobs back. Either way the jobs cost two round trips; before issue
// 24 the unknown case cost four (the rollback and the second statement
// each alone). Once learned, the class ends its wave, so nothing after it
// runs twice.
func TestAClassThatTookTwoStatementsSendsTheSecondWithTheNextWave(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counts := []int{1, 1, 2, 1, 1, 1}
	classes := []string{"one", "one", "two", "one", "one", "one"}
	var shapes batch.Shapes
	for _, c := range []struct {
		base  int
		trips int64
	}{
		// Unknown classes: one wave of six, cut at job 2; then the
		// rollback of jobs 3-5, job 2's second statement and jobs 3-5
		// again.
		{0, 2},
		// Learned: jobs 0-2, then job 2's second statement with jobs 3-5.
		{10, 2},
	} {
		var jobs []batch.Job
		for k, n := range counts {
			jobs = append(jobs, bump(c.base+k, n, nil))
		}
		n, errs, err, trips := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Shapes: &shapes}, nil)
		require.NoError(t, err)
		require.Equal(t, len(jobs), n)
		require.Equal(t, make([]error, len(jobs)), errs)
		require.Equal(t, c.trips, trips, "round trips from job %d", c.base)
		for k, n := range counts {
			require.Equal(t, n, b.counter(t, c.base+k), "counter %d", c.base+k)
		}
	}
}

func TestAFailingJobIsRolledBackToItsSavepointAndTheOthersStay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("boom")
	jobs := []batch.Job{bump(0, 1, nil), bump(1, 1, nil), bump(2, 2, boom), bump(3, 1, nil), bump(4, 1, nil)}
	n, errs, err, _ := b.run(t, context.Background(), jobs, nil)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.ErrorIs(t, errs[2], boom)
	for _, k := range []int{0, 1, 3, 4} {
		require.NoError(t, errs[k])
		require.Equal(t, 1, b.counter(t, k))
	}
	require.Equal(t, 0, b.counter(t, 2), "the failed job's statements were rolled back")
}

func TestAStatementThatFailsInThePipelineFailsOnlyItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := func(ctx context.Context, db batch.DB) error {
		_, err := db.Exec(ctx, "INSERT INTO counters (k, n) VALUES (NULL, 1)") // not null violation
		return err
	}
	jobs := []batch.Job{bump(0, 1, nil), bad, bump(2, 1, nil), bump(3, 1, nil)}
	n, errs, err, _ := b.run(t, context.Background(), jobs, nil)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, errs[1], &pgErr)
	require.Equal(t, "23502", pgErr.Code)
	for _, k := range []int{0, 2, 3} {
		require.NoError(t, errs[k])
		require.Equal(t, 1, b.counter(t, k))
	}
}

func TestQueryRowAndQueryRepliesReachTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), "INSERT INTO counters (k, n) VALUES (100, 7), (101, 8)")
	require.NoError(t, err)
	var found, missing, sum int
	var noRows error
	jobs := []batch.Job{
		func(ctx context.Context, db batch.DB) error {
			return db.QueryRow(ctx, "SELECT n FROM counters WHERE k = 100").Scan(&found)
		},
		func(ctx context.Context, db batch.DB) error {
			noRows = db.QueryRow(ctx, "SELECT n FROM counters WHERE k = -1").Scan(&missing)
			return nil
		},
		func(ctx context.Context, db batch.DB) error { // rows: a Query goes alone
			rows, err := db.Query(ctx, "SELECT n FROM counters WHERE k >= 100 ORDER BY k")
			if err != nil {
				return err
			}
			ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
			for _, n := range ns {
				sum += n
			}
			return err
		},
		bump(3, 1, nil),
	}
	n, errs, err, _ := b.run(t, context.Background(), jobs, nil)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, make([]error, 4), errs)
	require.Equal(t, 7, found)
	require.ErrorIs(t, noRows, pgx.ErrNoRows)
	require.Equal(t, 15, sum)
	require.Equal(t, 1, b.counter(t, 3))
}

func TestRunStopsStartingJobsWhenMoreSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	asked := 0
	more := func() bool { asked++; return asked < 3 } // the first job, then two more
	var jobs []batch.Job
	for k := range 6 {
		jobs = append(jobs, bump(k, 1, nil))
	}
	n, errs, err, _ := b.run(t, context.Background(), jobs, more)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Len(t, errs, 3)
	for k := range 6 {
		want := 0
		if k < 3 {
			want = 1
		}
		require.Equal(t, want, b.counter(t, k), "counter %d", k)
	}
}

func TestACallWhoseContextIsDoneIsNotSentOnEitherPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	jobs := []batch.Job{
		bump(0, 1, nil),
		// Pipeline path: its first call.
		func(_ context.Context, db batch.DB) error {
			_, err := db.Exec(cancelled, "INSERT INTO counters (k, n) VALUES (1, 1)")
			return err
		},
		// Alone path: its second call, after a first one that ran.
		func(ctx context.Context, db batch.DB) error {
			if _, err := db.Exec(ctx, "INSERT INTO counters (k, n) VALUES (2, 1)"); err != nil {
				return err
			}
			_, err := db.Exec(cancelled, "INSERT INTO counters (k, n) VALUES (20, 1)")
			return err
		},
		bump(3, 1, nil),
	}
	n, errs, err, _ := b.run(t, context.Background(), jobs, nil)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], context.Canceled)
	require.ErrorIs(t, errs[2], context.Canceled)
	require.NoError(t, errs[3])
	require.Equal(t, 1, b.counter(t, 0))
	require.Equal(t, 0, b.counter(t, 1), "not sent")
	require.Equal(t, 0, b.counter(t, 2), "its job failed: rolled back to its savepoint")
	require.Equal(t, 0, b.counter(t, 20), "not sent")
	require.Equal(t, 1, b.counter(t, 3))
}

func TestAJobThatSwallowsAnErrorFailsTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	swallow := func(ctx context.Context, db batch.DB) error {
		_, _ = db.Exec(ctx, "INSERT INTO counters (k, n) VALUES (NULL, 1)")
		_, err := db.Exec(ctx, "INSERT INTO counters (k, n) VALUES (1, 1)") // in an aborted transaction
		_ = err
		return nil
	}
	_, _, err, _ := b.run(t, context.Background(), []batch.Job{bump(0, 1, nil), swallow, bump(2, 1, nil)}, nil)
	// Run sees the aborted transaction (b.run then rolls back), or the
	// commit fails: nothing of it holds either way.
	_ = err
	require.Equal(t, 0, b.db.Count(t, "counters", ""), "an aborted transaction commits nothing")
}

func TestRandomMixesApplyEveryJobOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			randomMixes(t, setupMode(t, mode))
		})
	}
}

func randomMixes(t *testing.T, b *testBundle) {
	r := rand.New(rand.NewPCG(7, 8))
	// Half the rounds with classes (a job's class is its statement count,
	// so Shapes learns that classes 2 and 3 take several): which jobs end a
	// wave must change nothing of what is applied.
	var shapes batch.Shapes
	for round := range 80 {
		b.truncate(t)
		size := 1 + r.IntN(50)
		counts := make([]int, size)
		fails := make([]bool, size)
		var jobs []batch.Job
		var classes batch.Classes
		if round%2 == 1 {
			classes.Shapes = &shapes
		}
		for k := range size {
			counts[k] = r.IntN(4) // 0 to 3 statements
			class := strconv.Itoa(counts[k])
			if round%4 == 3 {
				// Classes that say nothing of the statements: a job whose
				// class took two statements before may want a third at
				// the head of the next wave, or none.
				class = strconv.Itoa(r.IntN(3))
			}
			classes.Of = append(classes.Of, class)
			switch r.IntN(9) {
			case 0:
				fails[k] = true
				jobs = append(jobs, bump(k, counts[k], fmt.Errorf("job %d fails", k)))
			case 1:
				// A statement of its own fails on the server, wherever
				// it is in a pipeline (the head of a wave, say).
				fails[k] = true
				jobs = append(jobs, bumpThenFail(k, counts[k]))
			default:
				jobs = append(jobs, bump(k, counts[k], nil))
			}
		}
		n, errs, err, _ := b.runClasses(t, context.Background(), jobs, classes, nil)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, size, n)
		b.requireEachJobOnce(t, round, errs, counts, fails)
	}
}

// requireEachJobOnce checks a random round: job k failed (its counter 0)
// when fails[k], else it succeeded and its counter is counts[k], its
// statements each counted once.
func (b *testBundle) requireEachJobOnce(t *testing.T, round int, errs []error, counts []int, fails []bool) {
	t.Helper()
	for k := range counts {
		want := counts[k]
		if fails[k] {
			want = 0
			require.Error(t, errs[k], "round %d job %d", round, k)
		} else {
			require.NoError(t, errs[k], "round %d job %d", round, k)
		}
		require.Equal(t, want, b.counter(t, k), "round %d job %d (%d statements, fails %v)", round, k, counts[k], fails[k])
	}
}

// A job whose second statement heads the next wave, and whose context is
// done by then (here, while more decides), does not send it: the job gets
// the context's error, and its first statement is rolled back.
func TestACarriedCallWhoseContextIsDoneIsNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first wave: jobs 0 and 1, job 1 last; then job 1 is carried, its
	// second call pending, when its context is done.
	more := moreUntil(2, cancel)
	n, errs, err, _ := b.run(t, context.Background(), []batch.Job{bump(0, 1, nil), bumpOn(jobCtx, 1, 2), bump(2, 1, nil)}, more)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], context.Canceled)
	require.NoError(t, errs[2])
	require.Equal(t, []int{1, 0, 1}, []int{b.counter(t, 0), b.counter(t, 1), b.counter(t, 2)})
}

// A carried job whose second call was answered with its context's error
// (not sent), and which goes on with a Query, runs that Query alone, its
// rows read in full, and nothing of it is sent in a pipeline.
func TestACarriedJobsQueryAfterAnAnsweredCallGoesAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []int
	carried := queryAfterUnsentCall(jobCtx, 1, "SELECT g FROM generate_series(1, 3) g", &got)
	asked := 0
	more := func() bool {
		asked++
		switch asked {
		case 2:
			return false // the first wave: jobs 0 and 1, job 1 last
		case 3:
			cancel() // job 1 is carried, its second call pending
		}
		return true
	}
	n, errs, err, _ := b.run(t, context.Background(), []batch.Job{bump(0, 1, nil), carried, bump(2, 1, nil)}, more)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, []error{nil, nil, nil}, errs)
	require.Equal(t, []int{1, 2, 3}, got)
	require.Equal(t, []int{1, 1, 1, 0}, []int{b.counter(t, 0), b.counter(t, 1), b.counter(t, 2), b.counter(t, 20)}, "counters 0, 1, 2 and the unsent 20")
}

// On a connection that caches the statements it prepares (the worker's,
// internal/database), a transaction's savepoint statements are one per job
// position however many waves it takes: each new statement costs a round
// trip to prepare it and a place in the cache, and a name per wave made
// them grow with the waves (issue 24). Jobs of two statements cut every
// wave; ten jobs, three transactions.
func TestSavepointStatementsAreOnePerJobPosition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	const jobsPerRun = 10
	for run := range 3 {
		var jobs []batch.Job
		for k := range jobsPerRun {
			jobs = append(jobs, bump(run*jobsPerRun+k, 2, nil))
		}
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		n, errs, err := batch.Run(ctx, tx, jobs, nil)
		require.NoError(t, err)
		require.Equal(t, jobsPerRun, n)
		require.Equal(t, make([]error, jobsPerRun), errs)
		require.NoError(t, tx.Commit(ctx))
	}
	for k := range 3 * jobsPerRun {
		require.Equal(t, 2, b.counter(t, k), "counter %d", k)
	}
	var savepoints int
	require.NoError(t, conn.QueryRow(ctx,
		"SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'SAVEPOINT %' OR statement LIKE 'ROLLBACK TO SAVEPOINT %'").Scan(&savepoints))
	require.LessOrEqual(t, savepoints, 2*jobsPerRun, "savepoint statements prepared on the connection")
}

// On a caching connection (the worker's), a job that cuts its wave while a
// statement after it failed on the server leaves the transaction aborted,
// and pgx forgets the statements of that round trip: the rollback of the
// jobs after it must run before pgx prepares them again for the next round
// trip, which an aborted transaction refuses. Job 1's statement fails; job
// 0 takes two statements (its second heads the next wave: send), or three
// (it also wants a third at the head of that wave, after a failure there
// too: rollbackThen); job 2 takes one.
func TestACutAfterAFailedStatementRollsBackBeforeAnythingIsPrepared(t *testing.T) {
	t.Parallel()
	for _, statements := range []int{2, 3} {
		t.Run(strconv.Itoa(statements), func(t *testing.T) {
			t.Parallel()
			b := setupMode(t, pgx.QueryExecModeCacheStatement)
			n, errs, err, _ := b.run(t, context.Background(), []batch.Job{bump(0, statements, nil), failing, bump(2, 1, nil)}, nil)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			require.NoError(t, errs[0])
			require.Error(t, errs[1])
			require.NoError(t, errs[2])
			require.Equal(t, statements, b.counter(t, 0))
			require.Equal(t, 1, b.counter(t, 2))
		})
	}
}

// A job that cut its wave (jobs 0, 1 and 2 sent; job 1 wants a second
// statement) leaves the rollback of job 2 for the next round trip. When its
// second call is not sent (its context is done by then), that rollback
// still runs first: if the job returns, before job 1's own rollback (without
// it the transaction fails: job 2's savepoint is gone); if it goes on with
// a Query (alone) and a write, before the Query, which does not see job 2's
// row, and the write stands (without it the rollback sent after would undo
// the write of a job that reported success: an effect lost).
func TestACarriedJobAfterACutWhoseCallIsNotSent(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
		for _, goesOn := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/goes_on=%v", mode, goesOn), func(t *testing.T) {
				t.Parallel()
				b := setupMode(t, mode)
				jobCtx, cancel := context.WithCancel(context.Background())
				defer cancel()
				carried, counter1 := bumpOn(jobCtx, 1, 2), 0
				var ks []int
				if goesOn {
					carried, counter1 = func(ctx context.Context, db batch.DB) error {
						if err := queryAfterUnsentCall(jobCtx, 1, "SELECT k FROM counters WHERE k = 2", &ks)(ctx, db); err != nil {
							return err
						}
						return bump(1, 1, nil)(ctx, db)
					}, 2
				}
				n, errs, err, _ := b.run(t, context.Background(), []batch.Job{bump(0, 1, nil), carried, bump(2, 1, nil), bump(3, 1, nil)}, moreUntil(3, cancel))
				require.NoError(t, err)
				require.Equal(t, 4, n)
				require.NoError(t, errs[0])
				if goesOn {
					require.NoError(t, errs[1])
				} else {
					require.ErrorIs(t, errs[1], context.Canceled)
				}
				require.NoError(t, errs[2])
				require.NoError(t, errs[3])
				require.Empty(t, ks, "the carried job's query must not see job 2's rolled-back row")
				require.Equal(t, []int{1, counter1, 1, 1, 0}, []int{b.counter(t, 0), b.counter(t, 1), b.counter(t, 2), b.counter(t, 3), b.counter(t, 20)})
			})
		}
	}
}

// steadyShapes is a Shapes that has seen enough jobs of class "one", each
// of one statement and none failing, to know the class is steady (counters
// 1000 and up, reset after).
func (b *testBundle) steadyShapes(t *testing.T) *batch.Shapes {
	t.Helper()
	var shapes batch.Shapes
	var jobs []batch.Job
	var classes []string
	for k := range 10 {
		jobs, classes = append(jobs, bump(1000+k, 1, nil)), append(classes, "one")
	}
	n, errs, err, _ := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Shapes: &shapes}, nil)
	require.NoError(t, err)
	require.Equal(t, len(jobs), n)
	require.Equal(t, make([]error, len(jobs)), errs)
	_, err = b.db.Pool.Exec(context.Background(), "DELETE FROM counters WHERE k >= 1000")
	require.NoError(t, err)
	return &shapes
}

// Jobs of a steady class (one statement each, none failed) share their
// wave's savepoint: 20 of them are one SAVEPOINT and 20 statements in one
// round trip, where each job had its own (issue 24); while the classes are
// not known yet, every job has its own.
func TestJobsOfASteadyClassShareTheirWavesSavepoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.savepoints.n.Load()
	shapes := b.steadyShapes(t)
	require.EqualValues(t, 10, b.savepoints.n.Load()-before, "learning: a savepoint per job")
	var jobs []batch.Job
	var classes []string
	for k := range 20 {
		jobs, classes = append(jobs, bump(k, 1, nil)), append(classes, "one")
	}
	before = b.savepoints.n.Load()
	n, errs, err, trips := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Shapes: shapes}, nil)
	require.NoError(t, err)
	require.Equal(t, 20, n)
	require.Equal(t, make([]error, 20), errs)
	require.EqualValues(t, 1, trips)
	require.EqualValues(t, 1, b.savepoints.n.Load()-before, "one savepoint for the wave")
	for k := range 20 {
		require.Equal(t, 1, b.counter(t, k), "counter %d", k)
	}
	// A class of one statement of which one job in ten failed keeps a
	// savepoint per job: a failure rolls back to the job's own, and the
	// run never restarts for it.
	jobs, classes = nil, nil
	for k := range 10 {
		var fail error
		if k == 3 {
			fail = errors.New("boom")
		}
		jobs, classes = append(jobs, bump(100+k, 1, fail)), append(classes, "flaky")
	}
	_, _, err, _ = b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Shapes: shapes}, nil)
	require.NoError(t, err)
	jobs = jobs[:0]
	for k := range 20 {
		jobs = append(jobs, bump(200+k, 1, nil))
	}
	before = b.savepoints.n.Load()
	_, _, err, _ = b.runClasses(t, context.Background(), jobs, batch.Classes{Of: append(classes, classes...), Shapes: shapes}, nil)
	require.NoError(t, err)
	require.EqualValues(t, 20, b.savepoints.n.Load()-before, "a savepoint per job of a class that failed")
}

// A job of a steady class that takes more statements than its class, or
// fails, needs a rollback to a savepoint the run left out: the run rolls
// back to the wave's savepoint and starts the jobs from there again, each
// under its own. Each job's statements count once, the failed job's not at
// all, and the jobs before the wave keep theirs.
func TestASteadyClassJobThatSurprisesRestartsTheJobsFromTheSavepointBefore(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	// more says no at every fifth call: waves of jobs 0-4, 5-8, 9-12, ...
	// Job 10 is inside its wave, job 12 the last of it (a job that wants a
	// second statement there sends it at the head of the next wave).
	for _, c := range []struct {
		name       string
		pos        int
		surprise   func(k int) batch.Job
		statements int // the surprising job's counter at the end
		fails      bool
		// restarts: the run restarts from job 9 (job 9 runs twice); runs:
		// how many times the surprising job runs.
		restarts bool
		runs     int64
	}{
		// It cuts its wave: jobs 11 and 12 have no savepoint to roll back
		// to, and the run restarts from job 9's.
		{"two statements", 10, func(k int) batch.Job { return bump(k, 2, nil) }, 2, false, true, 2},
		{"three statements", 10, func(k int) batch.Job { return bump(k, 3, nil) }, 3, false, true, 2},
		{"a second statement fails", 10, func(k int) batch.Job { return bumpThenFail(k, 1) }, 0, true, true, 2},
		// It fails with no savepoint of its own: the run restarts from
		// job 9's, and the job stands failed without running again.
		{"fails after its statement", 10, func(k int) batch.Job { return bump(k, 1, boom) }, 0, true, true, 1},
		{"a second statement fails, last of its wave", 12, func(k int) batch.Job { return bumpThenFail(k, 1) }, 0, true, true, 1},
		// Its second statement heads the next wave, and a third cuts that
		// wave at job 13, which has its savepoint (the first of the wave):
		// no restart.
		{"two statements, last of its wave", 12, func(k int) batch.Job { return bump(k, 2, nil) }, 2, false, false, 1},
		{"three statements, last of its wave", 12, func(k int) batch.Job { return bump(k, 3, nil) }, 3, false, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
				b := setupMode(t, mode)
				shapes := b.steadyShapes(t)
				var jobs []batch.Job
				var classes []string
				for k := range 20 {
					job := bump(k, 1, nil)
					if k == c.pos {
						job = c.surprise(k)
					}
					jobs, classes = append(jobs, job), append(classes, "one")
				}
				jobs, last, runs := lastRuns(jobs)
				n, errs, err, _ := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Shapes: shapes}, everyFifth())
				require.NoError(t, err, mode)
				require.Equal(t, 20, n)
				require.Equal(t, errs, last, "each job's last run is the one Run reports")
				for k := range 20 {
					want := 1
					if k == c.pos {
						want = c.statements
					}
					if k == c.pos && c.fails {
						require.Error(t, errs[k])
					} else {
						require.NoError(t, errs[k], "%s job %d", mode, k)
					}
					require.Equal(t, want, b.counter(t, k), "%s counter %d", mode, k)
				}
				require.Equal(t, c.runs, runs[c.pos].Load(), "runs of job %d", c.pos)
				require.EqualValues(t, 1, runs[8].Load(), "job 8, in the wave before, runs once")
				require.Equal(t, map[bool]int64{true: 2, false: 1}[c.restarts], runs[9].Load(), "runs of job 9, first of the wave")
			}
		})
	}
}

// lastRuns wraps jobs so that each one's error is written to last[k] when
// it returns, as the worker's jobs write their results, and its runs are
// counted in runs[k]: after Run, last must agree with Run's errors, so no
// earlier run of a restarted job returned after its last run did.
func lastRuns(jobs []batch.Job) ([]batch.Job, []error, []atomic.Int64) {
	last := make([]error, len(jobs))
	runs := make([]atomic.Int64, len(jobs))
	wrapped := make([]batch.Job, len(jobs))
	for k, job := range jobs {
		wrapped[k] = func(ctx context.Context, db batch.DB) error {
			runs[k].Add(1)
			err := job(ctx, db)
			last[k] = err
			return err
		}
	}
	return wrapped, last, runs
}

// everyFifth is a more that says no at every fifth call: Run sends the
// jobs it has started and asks again.
func everyFifth() func() bool {
	asked := 0
	return func() bool {
		asked++
		return asked%5 != 0
	}
}

// A restart whose jobs then send nothing (their context is done by then)
// still rolls back what they did before it: job 1, of a steady class,
// cancels the jobs' context and then wants a second statement, which is
// not sent; its failure needs a savepoint the run left out, so the run
// restarts from job 0's: job 0 and job 2 run again and fail at once, and
// job 1 stands failed. Nothing of them stands.
func TestARestartWhoseJobsSendNothingStillRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shapes := b.steadyShapes(t)
	jobCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cancelling := func(_ context.Context, db batch.DB) error {
		if err := bump(1, 1, nil)(jobCtx, db); err != nil {
			return err
		}
		cancel()
		return bump(1, 1, nil)(jobCtx, db)
	}
	jobs := []batch.Job{bumpOn(jobCtx, 0, 1), cancelling, bumpOn(jobCtx, 2, 1)}
	n, errs, err, _ := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: []string{"one", "one", "one"}, Shapes: shapes}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for k := range 3 {
		require.ErrorIs(t, errs[k], context.Canceled, "job %d", k)
		require.Equal(t, 0, b.counter(t, k), "counter %d", k)
	}
}

// A job whose failure restarted the run is reported failed even when more
// says no from its position on: it is not left unreported (and so run again
// in the caller's next transaction). Jobs 0-4 in one wave, job 2 fails
// without a savepoint of its own; after the restart more says yes to job 1
// and no from then on.
func TestAFailedJobIsReportedWhenMoreSaysNoAfterTheRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shapes := b.steadyShapes(t)
	boom := errors.New("boom")
	jobs := []batch.Job{bump(0, 1, nil), bump(1, 1, nil), bump(2, 1, boom), bump(3, 1, nil), bump(4, 1, nil)}
	asked := 0
	more := func() bool {
		asked++
		return asked <= 5 // jobs 1-4, then job 1 again
	}
	n, errs, err, _ := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: []string{"one", "one", "one", "one", "one"}, Shapes: shapes}, more)
	require.NoError(t, err)
	require.Equal(t, 3, n, "jobs 0 and 1 applied, job 2 failed; 3 and 4 for the next transaction")
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], boom)
	require.Equal(t, []int{1, 1, 0, 0, 0}, []int{b.counter(t, 0), b.counter(t, 1), b.counter(t, 2), b.counter(t, 3), b.counter(t, 4)})
}

// Random mixes of jobs of a steady class, most of one statement, some
// taking none, two or three, some failing: every job's statements count
// once, a failed job's not at all, whatever savepoints the run left out
// and however often it restarts.
func TestRandomMixesOfSteadyClassesApplyEveryJobOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setupMode(t, mode)
			r := rand.New(rand.NewPCG(9, 10))
			for round := range 60 {
				shapes := b.steadyShapes(t)
				b.truncate(t)
				size := 1 + r.IntN(50)
				counts := make([]int, size)
				fails := make([]bool, size)
				var jobs []batch.Job
				var classes []string
				for k := range size {
					counts[k] = 1
					classes = append(classes, "one")
					switch r.IntN(12) {
					case 0:
						counts[k] = r.IntN(4)
					case 1:
						fails[k] = true
						jobs = append(jobs, bump(k, 1+r.IntN(2), fmt.Errorf("job %d fails", k)))
						continue
					case 2:
						fails[k] = true
						jobs = append(jobs, bumpThenFail(k, 1))
						continue
					}
					jobs = append(jobs, bump(k, counts[k], nil))
				}
				jobs, last, _ := lastRuns(jobs)
				n, errs, err, _ := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Shapes: shapes}, nil)
				require.NoError(t, err, "round %d", round)
				require.Equal(t, size, n)
				require.Equal(t, errs, last, "round %d: each job's last run is the one Run reports", round)
				b.requireEachJobOnce(t, round, errs, counts, fails)
			}
		})
	}
}
