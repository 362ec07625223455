package inbox

import "fmt"

// DefaultMaxAttempts is MAX_ATTEMPTS when it is not set: the attempts a
// receipt gets before it waits for review.
const DefaultMaxAttempts = 10

// CheckMaxAttempts is the range of MAX_ATTEMPTS, the attempts after which
// a receipt waits for review (RecordFailure, ParkNeedsReview, Stats): the
// one bound that the worker (worker.Config) and internal/ops, which must
// classify receipts with the worker's limit, both check.
func CheckMaxAttempts(n int) error {
	if n < 1 || n > 1000 {
		return fmt.Errorf("MAX_ATTEMPTS=%d: must be from 1 to 1000", n)
	}
	return nil
}
