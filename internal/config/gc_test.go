package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
)

// TestWorkerGC: the worker collects at WorkerGCPercent unless GOGC is set,
// and on Lambda keeps a soft memory limit of three quarters of the
// function's memory unless GOMEMLIMIT is set; a memory size that is not
// one fails at start.
func TestWorkerGC(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		env  []string
		want config.GC
	}{
		"defaults, outside Lambda": {nil, config.GC{Percent: config.WorkerGCPercent}},
		"GOGC set":                 {[]string{"GOGC", "100"}, config.GC{}},
		"on Lambda":                {[]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256"}, config.GC{Percent: config.WorkerGCPercent, MemoryLimit: 192 << 20}},
		"on Lambda, GOMEMLIMIT":    {[]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256", "GOMEMLIMIT", "100MiB"}, config.GC{Percent: config.WorkerGCPercent}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := config.LoadWorker(env(append([]string{"DATABASE_URL", localDB, "STRIPE_MODE", "test"}, tc.env...)...))
			require.NoError(t, err)
			require.Equal(t, tc.want, c.GC)
		})
	}
	_, err := config.LoadWorker(env("DATABASE_URL", localDB, "STRIPE_MODE", "test", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256MB"))
	require.ErrorContains(t, err, `AWS_LAMBDA_FUNCTION_MEMORY_SIZE="256MB": must be the function's memory in MB (128 to 10240), as Lambda sets it; unset it outside Lambda`)
	_, err = config.LoadWorker(env("DATABASE_URL", localDB, "STRIPE_MODE", "test", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "99999999999999"))
	require.ErrorContains(t, err, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE=\"99999999999999\"")
}
