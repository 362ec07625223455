package batch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/batch"
)

// logged is a job of statements statements, each adding 1 to counter k and
// logging (k, its number) in statement_log, whose id numbers the
// statements in the order the server ran them; the job then returns fail.
func logged(k, statements int, fail error) batch.Job {
	return func(ctx context.Context, db batch.DB) error {
		for s := range statements {
			if _, err := db.Exec(ctx, `WITH logged AS (INSERT INTO statement_log (job, stmt) VALUES ($1, $2))
INSERT INTO counters (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = counters.n + 1`, k, s); err != nil {
				return err
			}
		}
		return fail
	}
}

// loggedThenFail is logged whose job then makes a statement that fails on
// the server, and returns its error.
func loggedThenFail(k, statements int) batch.Job {
	return func(ctx context.Context, db batch.DB) error {
		if err := logged(k, statements, nil)(ctx, db); err != nil {
			return err
		}
		_, err := db.Exec(ctx, "SELECT 1 / 0")
		return err
	}
}

// statementLog is what committed of statement_log: (job, statement) in
// the order the server ran them.
func (b *testBundle) statementLog(t *testing.T) [][2]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), "SELECT job, stmt FROM statement_log ORDER BY id")
	require.NoError(t, err)
	log, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]int, error) {
		var e [2]int
		return e, row.Scan(&e[0], &e[1])
	})
	require.NoError(t, err)
	return log
}

// requireKeyOrder checks what committed of statement_log: each job's
// statements in order and each once, and every statement of a job before
// every statement of each later job it conflicts with (the same key, or
// either without one). It returns the jobs in the order their first
// statements ran.
func (b *testBundle) requireKeyOrder(t *testing.T, round int, keys []string) []int {
	t.Helper()
	first, last, next := map[int]int{}, map[int]int{}, map[int]int{}
	var order []int
	for i, e := range b.statementLog(t) {
		job, stmt := e[0], e[1]
		require.Equal(t, next[job], stmt, "round %d: job %d's statements in order, each once", round, job)
		next[job]++
		if _, ok := first[job]; !ok {
			first[job] = i
			order = append(order, job)
		}
		last[job] = i
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[i] != "" && keys[j] != "" && keys[i] != keys[j] {
				continue
			}
			_, iRan := first[i]
			_, jRan := first[j]
			if iRan && jRan {
				require.Less(t, last[i], first[j], "round %d: job %d (key %q) ran before job %d (key %q)", round, i, keys[i], j, keys[j])
			}
		}
	}
	return order
}

// Jobs of different keys send their further statements together, after
// the first statements of the jobs after them: six jobs, three of two
// statements, are two round trips once their classes are learned, where
// without keys each job of two statements ends its wave (four).
func TestJobsOfDifferentKeysInterleaveTheirStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counts := []int{2, 1, 2, 1, 2, 1}
	classes := []string{"two", "one", "two", "one", "two", "one"}
	keys := []string{"a", "b", "c", "d", "e", "f"}
	var shapes batch.Shapes
	for _, c := range []struct {
		name  string
		keys  []string
		trips int64
	}{
		// Not learned yet: one wave of six, then the three second
		// statements (no job after one of them shares its key).
		{"keys, unknown classes", keys, 2},
		{"keys, learned", keys, 2},
		// Jobs 0, 0's second statement with 1 and 2, 2's with 3 and 4,
		// 4's with 5.
		{"no keys, learned", nil, 4},
	} {
		_, err := b.db.Pool.Exec(context.Background(), "TRUNCATE counters, statement_log")
		require.NoError(t, err)
		var jobs []batch.Job
		for k, n := range counts {
			jobs = append(jobs, logged(k, n, nil))
		}
		n, errs, err, trips := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Keys: c.keys, Shapes: &shapes}, nil)
		require.NoError(t, err, c.name)
		require.Equal(t, len(jobs), n, c.name)
		require.Equal(t, make([]error, len(jobs)), errs, c.name)
		require.Equal(t, c.trips, trips, c.name)
		for k, n := range counts {
			require.Equal(t, n, b.counter(t, k), "%s: counter %d", c.name, k)
		}
		keys := c.keys
		if keys == nil {
			keys = make([]string, len(jobs)) // without keys, every job conflicts with every other
		}
		b.requireKeyOrder(t, 0, keys)
	}
}

// A job that wants a statement more than its class led to expect cuts its
// wave at the first job after it of its key: that job is rolled back and
// sent again after the statement; the jobs between (other keys) stay.
func TestAJobThatWantsMoreCutsItsWaveAtTheNextJobOfItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := []string{"a", "b", "a", "c"}
	jobs, _, runs := lastRuns([]batch.Job{logged(0, 2, nil), logged(1, 1, nil), logged(2, 1, nil), logged(3, 1, nil)})
	n, errs, err, trips := b.runClasses(t, context.Background(), jobs, batch.Classes{Keys: keys}, nil)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, make([]error, 4), errs)
	// The wave of four, then the rollback of jobs 2 and 3, job 0's second
	// statement and jobs 2 and 3 again.
	require.EqualValues(t, 2, trips)
	b.requireKeyOrder(t, 0, keys)
	require.Equal(t, [][2]int{{0, 0}, {1, 0}, {0, 1}, {2, 0}, {3, 0}}, b.statementLog(t), "job 1 ran between job 0's statements (not sent again); job 2 after them")
	for k, want := range []int{2, 1, 1, 1} {
		require.Equal(t, want, b.counter(t, k), "counter %d", k)
		require.EqualValues(t, 1, runs[k].Load(), "job %d started once (sent again, not restarted)", k)
	}
}

// A job that fails after statements of jobs after it ran (its own ran in
// two waves) stands failed, and the jobs after it run again: none of them
// is left half applied, and each counts once.
func TestAPendingJobThatFailsRunsTheJobsAfterItAgain(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		job  batch.Job
	}{
		{"its second statement fails on the server", loggedThenFail(0, 1)},
		{"it returns an error after two statements", logged(0, 2, errors.New("job 0 fails"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			runs := b.runKeyed(t, batch.Classes{Keys: []string{"a", "b", "c"}}, []bool{true, false, false},
				c.job, logged(1, 1, nil), logged(2, 2, nil))
			require.Equal(t, []int{0, 1, 2}, b.counters(t, 0, 1, 2))
			require.EqualValues(t, 1, runs[0], "the failed job is not run again")
			require.EqualValues(t, 2, runs[1], "rolled back with it, and run again")
		})
	}
}

// A pending job that fails when a job before it is pending too: the
// restart goes back to the earliest job whose statements ran after the
// failed job's savepoint (job 0's second statement ran after job 1's
// savepoint), so that no job is left with part of its statements undone.
func TestARestartGoesBackToTheEarliestJobWhoseStatementsItUndoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runs := b.runKeyed(t, batch.Classes{Keys: []string{"a", "b", "c"}}, []bool{false, true, false},
		logged(0, 3, nil), loggedThenFail(1, 1), logged(2, 1, nil))
	require.Equal(t, []int{3, 0, 1}, b.counters(t, 0, 1, 2))
	require.EqualValues(t, 2, runs[0], "job 0, pending when job 1 failed, ran again")
}

// Random mixes of keyed jobs (a few keys, some jobs without one), of zero
// to three statements, some failing, with classes learned or not: every
// job's statements count once (a failed job's not at all), and a job's
// statements all run before those of any later job of its key.
func TestRandomMixesOfKeyedJobsKeepEachKeysOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setupMode(t, mode)
			r := rand.New(rand.NewPCG(13, 14))
			var shapes batch.Shapes
			for round := range 80 {
				b.truncate(t)
				size := 1 + r.IntN(50)
				counts, fails, keys := make([]int, size), make([]bool, size), randomKeys(r, size)
				var jobs []batch.Job
				classes := batch.Classes{Keys: keys}
				if round%2 == 1 {
					classes.Shapes = &shapes
				}
				if round%3 != 1 {
					// The out-of-order statements' lock waits bounded (no
					// lock is held: the settings go with them).
					classes.LockWait = time.Second
				}
				for k := range size {
					counts[k] = r.IntN(4)
					classes.Of = append(classes.Of, strconv.Itoa(counts[k]))
					if round%4 == 3 {
						classes.Of[k] = strconv.Itoa(r.IntN(3)) // classes that say nothing
					}
					switch r.IntN(9) {
					case 0:
						fails[k] = true
						jobs = append(jobs, logged(k, counts[k], fmt.Errorf("job %d fails", k)))
					case 1:
						fails[k] = true
						jobs = append(jobs, loggedThenFail(k, counts[k]))
					default:
						jobs = append(jobs, logged(k, counts[k], nil))
					}
				}
				jobs, last, _ := lastRuns(jobs)
				more := everyFifth()
				if round%3 == 0 {
					more = nil
				}
				n, errs, err, _ := b.runClasses(t, context.Background(), jobs, classes, more)
				require.NoError(t, err, "round %d", round)
				require.Equal(t, last[:n], errs, "round %d: each job's last run is the one Run reports", round)
				if n < size {
					// more said no: the rest are for another transaction.
					counts, fails, keys = counts[:n], fails[:n], keys[:n]
				}
				b.requireEachJobOnce(t, round, errs, counts, fails)
				b.requireKeyOrder(t, round, keys)
			}
		})
	}
}

// A restart for a job whose savepoint was left out (a job of a steady class
// that fails) goes back to the savepoint before it; a job before that
// savepoint that wants a further statement, sent in the same wave, goes on
// and finishes: nothing of it is left half done.
func TestARestartKeepsTheJobsBeforeItsSavepointThatWantMore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shapes := b.steadyShapes(t)
	// Job 0 (no class: not steady) wants a second statement; job 1 (no
	// class) keeps its savepoint; job 2, of the steady class, has none and
	// fails: the run restarts from job 1's savepoint.
	runs := b.runKeyed(t, batch.Classes{Of: []string{"", "", "one"}, Keys: []string{"a", "b", "c"}, Shapes: shapes}, []bool{false, false, true},
		logged(0, 2, nil), logged(1, 1, nil), failing)
	require.Equal(t, []int{2, 1}, b.counters(t, 0, 1))
	require.Equal(t, []int64{1, 2, 1}, runs, "job 0 went on; job 1 ran again; job 2 stands failed")
}

// A job that failed in its first wave (rolled back to its own savepoint)
// is not run again when a later restart goes back before it: it stands
// failed (a deadlock's or a lock timeout's victim would wait again).
func TestAFailedJobIsNotRunAgainByALaterRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Job 0 wants a second statement, which fails in the next wave; job 1
	// fails in the first.
	runs := b.runKeyed(t, batch.Classes{Keys: []string{"a", "b", "c"}}, []bool{true, true, false},
		loggedThenFail(0, 1), failing, logged(2, 1, nil))
	require.Equal(t, []int{0, 1}, b.counters(t, 0, 2))
	require.Equal(t, []int64{1, 1, 2}, runs)
}

// Random mixes of keyed jobs of a steady class (so most go without a
// savepoint of their own), a few taking none, two or three statements, a
// few failing: every job's statements count once, a failed job's not at
// all, and each key's order holds, however the run restarts.
func TestRandomMixesOfKeyedSteadyJobsKeepEachKeysOrder(t *testing.T) {
	t.Parallel()
	b := setupMode(t, pgx.QueryExecModeCacheStatement)
	r := rand.New(rand.NewPCG(15, 16))
	for round := range 60 {
		shapes := b.steadyShapes(t)
		b.truncate(t)
		size := 1 + r.IntN(50)
		counts, fails, keys, classes := make([]int, size), make([]bool, size), randomKeys(r, size), make([]string, size)
		var jobs []batch.Job
		for k := range size {
			counts[k], classes[k] = 1, "one"
			switch r.IntN(12) {
			case 0:
				counts[k] = r.IntN(4)
			case 1:
				fails[k] = true
				jobs = append(jobs, logged(k, 1+r.IntN(2), fmt.Errorf("job %d fails", k)))
				continue
			case 2:
				fails[k] = true
				jobs = append(jobs, loggedThenFail(k, r.IntN(2)))
				continue
			}
			jobs = append(jobs, logged(k, counts[k], nil))
		}
		jobs, last, _ := lastRuns(jobs)
		n, errs, err, _ := b.runClasses(t, context.Background(), jobs, batch.Classes{Of: classes, Keys: keys, Shapes: shapes, LockWait: time.Second}, nil)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, size, n)
		require.Equal(t, last, errs, "round %d: each job's last run is the one Run reports", round)
		b.requireEachJobOnce(t, round, errs, counts, fails)
		b.requireKeyOrder(t, round, keys)
	}
}

// A statement of a pending job sent after statements of jobs after it (it
// waits for a lock while the transaction holds their rows, out of the
// jobs' order) waits at most Classes.LockWait: here another transaction
// holds the row until the run is over, the statement fails with
// lock_not_available, its job stands failed and the job after it runs
// again. The bound holds for those statements alone: the job after reads
// the transaction's lock_timeout as it was, and so does the transaction
// after the run (the restart's rollback undid the setting, and a wave
// that ends well sets it back).
func TestAnInterleavedStatementWaitsForALockAtMostLockWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, "INSERT INTO counters (k, n) VALUES (99, 0)")
	require.NoError(t, err)
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck // after the run
	_, err = holder.Exec(ctx, "UPDATE counters SET n = n + 1 WHERE k = 99")
	require.NoError(t, err)

	waits := func(ctx context.Context, db batch.DB) error {
		if err := logged(0, 1, nil)(ctx, db); err != nil {
			return err
		}
		_, err := db.Exec(ctx, "UPDATE counters SET n = n + 1 WHERE k = 99") // held by holder
		return err
	}
	var seen []string
	readsLockTimeout := func(ctx context.Context, db batch.DB) error {
		if err := readLockTimeout(ctx, db, &seen); err != nil {
			return err
		}
		return logged(1, 1, nil)(ctx, db)
	}
	tx := b.beginWithLockTimeout(t)
	// Should the bound be missing, the wait ends anyway (statement_timeout,
	// 57014), and the test fails instead of waiting for its holder.
	_, err = tx.Exec(ctx, "SET LOCAL statement_timeout = '60s'")
	require.NoError(t, err)
	n, errs, err := batch.RunClasses(ctx, tx, []batch.Job{waits, readsLockTimeout}, batch.Classes{Keys: []string{"a", "b"}, LockWait: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, errs[0], &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available, not a wait as long as the transaction's lock_timeout")
	require.NoError(t, errs[1])
	require.Equal(t, []string{"5min", "5min"}, seen, "job 1 ran twice (the restart), seeing the transaction's lock_timeout")
	requireLockTimeout(t, tx, "5min")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []int{0, 1}, []int{b.counter(t, 0), b.counter(t, 1)})
}

// When the interleaved statements go through, the transaction's
// lock_timeout is set back after them, in the same round trip: the jobs
// after, and the transaction, see it as it was.
func TestTheLockTimeoutIsSetBackAfterTheInterleavedStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var seen []string
	reads := func(k, statements int) batch.Job {
		return func(ctx context.Context, db batch.DB) error {
			if err := logged(k, statements, nil)(ctx, db); err != nil {
				return err
			}
			return readLockTimeout(ctx, db, &seen)
		}
	}
	tx := b.beginWithLockTimeout(t)
	// Jobs 0 and 1 read after their first statements, which run with job
	// 2's in one wave; job 2, of job 0's key, is rolled back and sent
	// again in the next wave, after their reads. Job 0's read runs after
	// job 1's first statement: bounded. Job 1's, after nothing of a later
	// job that stands (job 2's was rolled back): not; nor job 2's.
	readsFirst := func(ctx context.Context, db batch.DB) error {
		if err := readLockTimeout(ctx, db, &seen); err != nil {
			return err
		}
		return logged(2, 1, nil)(ctx, db)
	}
	n, errs, err := batch.RunClasses(ctx, tx, []batch.Job{reads(0, 1), reads(1, 1), readsFirst}, batch.Classes{Keys: []string{"a", "b", "a"}, LockWait: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, make([]error, 3), errs)
	require.Equal(t, []string{"50ms", "5min", "5min"}, seen)
	requireLockTimeout(t, tx, "5min")
	require.NoError(t, tx.Commit(ctx))
}

// A wave of pending jobs alone, all of them after a later job's statement,
// sets the lock_timeout back at its end too: job 0's second and third
// statements each go in such a wave (job 1 finished in the first), and the
// transaction then reads its own lock_timeout.
func TestTheLockTimeoutIsSetBackAfterAWaveOfPendingJobsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var seen []string
	job0 := func(ctx context.Context, db batch.DB) error {
		if err := logged(0, 2, nil)(ctx, db); err != nil {
			return err
		}
		return readLockTimeout(ctx, db, &seen)
	}
	tx := b.beginWithLockTimeout(t)
	before := b.writes.Load()
	n, errs, err := batch.RunClasses(ctx, tx, []batch.Job{job0, logged(1, 1, nil)}, batch.Classes{Keys: []string{"a", "b"}, LockWait: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	require.EqualValues(t, 3, b.writes.Load()-before, "the first wave, then job 0's second and third statements, a wave each")
	require.Equal(t, 2, n)
	require.Equal(t, make([]error, 2), errs)
	require.Equal(t, []string{"50ms"}, seen)
	requireLockTimeout(t, tx, "5min")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []int{2, 1}, []int{b.counter(t, 0), b.counter(t, 1)})
}

// readLockTimeout appends the transaction's lock_timeout, as a statement
// of a job reads it, to seen.
func readLockTimeout(ctx context.Context, db batch.DB, seen *[]string) error {
	var v string
	if err := db.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&v); err != nil {
		return err
	}
	*seen = append(*seen, v)
	return nil
}

// beginWithLockTimeout begins a transaction on b's connection whose own
// lock_timeout is 5min (rolled back at the end of the test unless
// committed).
func (b *testBundle) beginWithLockTimeout(t *testing.T) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := b.conn.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // after a commit, a no-op
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '5min'")
	require.NoError(t, err)
	return tx
}

// requireLockTimeout checks the lock_timeout tx reads now.
func requireLockTimeout(t *testing.T, tx pgx.Tx, want string) {
	t.Helper()
	var got string
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT current_setting('lock_timeout')").Scan(&got))
	require.Equal(t, want, got)
}

// runKeyed runs jobs in one transaction with RunClasses and checks that
// every job ran, that the jobs marked in failed failed and the others did
// not, that each job's last run is the one reported, and each key's order
// (c.Keys). It returns how many times each job started.
func (b *testBundle) runKeyed(t *testing.T, c batch.Classes, failed []bool, jobs ...batch.Job) []int64 {
	t.Helper()
	jobs, last, runs := lastRuns(jobs)
	n, errs, err, _ := b.runClasses(t, context.Background(), jobs, c, nil)
	require.NoError(t, err)
	require.Equal(t, len(jobs), n)
	require.Equal(t, last, errs, "each job's last run is the one reported")
	for k := range jobs {
		if failed[k] {
			require.Error(t, errs[k], "job %d", k)
		} else {
			require.NoError(t, errs[k], "job %d", k)
		}
	}
	b.requireKeyOrder(t, 0, c.Keys)
	started := make([]int64, len(runs))
	for k := range runs {
		started[k] = runs[k].Load()
	}
	return started
}

// counters is the counters of the jobs ks.
func (b *testBundle) counters(t *testing.T, ks ...int) []int {
	t.Helper()
	var got []int
	for _, k := range ks {
		got = append(got, b.counter(t, k))
	}
	return got
}

// randomKeys is the keys of size jobs: one of a few (about one key for
// four jobs), or, for one job in ten, none.
func randomKeys(r *rand.Rand, size int) []string {
	keys := make([]string, size)
	for k := range keys {
		if r.IntN(10) > 0 {
			keys[k] = string(rune('a' + r.IntN(1+size/4)))
		}
	}
	return keys
}

// truncate empties the counters and the statement log for a new round.
func (b *testBundle) truncate(t *testing.T) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), "TRUNCATE counters, statement_log")
	require.NoError(t, err)
}
