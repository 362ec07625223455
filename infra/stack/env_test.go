package stack

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/config"
	"github.com/stripe-inbox/inbox/internal/config/configtest"
)

// resolvedEnv turns a function's synthesized environment into what Lambda
// would pass at run time: tokens (Ref, Fn::Join, Fn::GetAtt) are replaced by
// plausible values, and AWS_REGION, which Lambda sets, is added.
func resolvedEnv(t *testing.T, r resource) config.Env {
	t.Helper()
	m := map[string]string{"AWS_REGION": "eu-west-1"}
	for k, v := range environment(r) {
		switch s := v.(type) {
		case string:
			m[k] = s
		default:
			switch k {
			case "SIGNING_SECRET_ARNS":
				m[k] = "billing=arn:aws:secretsmanager:eu-west-1:123456789012:secret:billing-AbCdEf"
			case "DB_PROXY_HOST":
				m[k] = "inbox.proxy-abc.eu-west-1.rds.amazonaws.com"
			case "RECONCILER_ROLE_ARN":
				m[k] = "arn:aws:iam::123456789012:role/StripeInbox-dev-ReconcileFunctionServiceRole-AbCdEf"
			case "WRITEBACK_ROLE_ARN":
				m[k] = "arn:aws:iam::123456789012:role/StripeInbox-dev-WritebackFunctionServiceRole-AbCdEf"
			case "WEBHOOK_DB_SECRET_ARN", "WORKER_DB_SECRET_ARN", "PURGE_DB_SECRET_ARN", "LEGACY_DB_SECRET_ARN", "OPS_DB_SECRET_ARN",
				"RECONCILE_DB_SECRET_ARN", "STRIPE_API_KEY_SECRET_ARN", "INGEST_DB_SECRET_ARN", "WRITEBACK_DB_SECRET_ARN":
				m[k] = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:" + strings.ToLower(k) + "-AbCdEf"
			case "INGEST_QUEUE_URL", "INGEST_DLQ_URL":
				m[k] = "https://sqs.eu-west-1.amazonaws.com/123456789012/" + strings.ToLower(k)
			default:
				m[k] = fmt.Sprintf("token-for-%s", k)
			}
		}
	}
	return configtest.MapEnv(m)
}

// TestFunctionEnvironmentsPassConfigValidation feeds each function's
// environment, as the stack sets it, to the loader the function runs at
// start, so a setting the stack gets wrong fails here and not as an init
// error after a deploy.
func TestFunctionEnvironmentsPassConfigValidation(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, natDev, retired, live, ebOnly} {
		fns := s.appFunctions(t)
		_, err := config.LoadWebhook(resolvedEnv(t, fns["webhook"]))
		require.NoError(t, err, "webhook")
		_, err = config.LoadWorker(resolvedEnv(t, fns["worker"]))
		require.NoError(t, err, "worker")
		relay, err := config.LoadOutbox(resolvedEnv(t, fns["worker"]))
		require.NoError(t, err, "worker: outbox relay")
		require.Equal(t, s.settings.OutboxRelay, relay.Enabled, "worker: outbox relay")
		_, err = config.LoadPurge(resolvedEnv(t, fns["purge"]))
		require.NoError(t, err, "purge")
		_, err = config.LoadMigrate(resolvedEnv(t, fns["migrate"]))
		require.NoError(t, err, "migrate")
		_, err = config.LoadOps(resolvedEnv(t, fns["ops"]))
		require.NoError(t, err, "ops")
		_, err = config.LoadReconcile(resolvedEnv(t, fns["reconcile"]))
		require.NoError(t, err, "reconcile")
		_, err = config.LoadReconcileStore(resolvedEnv(t, fns["reconcilestore"]))
		require.NoError(t, err, "reconcilestore")
		if len(s.settings.EventBridgeSources) > 0 {
			_, ingest := s.one(t, "AWS::Lambda::Function", "IngestFunction")
			_, err = config.LoadIngest(resolvedEnv(t, ingest))
			require.NoError(t, err, "ingest")
		}
		if len(s.settings.WriteBacks) > 0 {
			_, sender := s.one(t, "AWS::Lambda::Function", "WritebackFunction")
			_, err = config.LoadWriteback(resolvedEnv(t, sender))
			require.NoError(t, err, "writeback")
			_, store := s.one(t, "AWS::Lambda::Function", "WritebackstoreFunction")
			_, err = config.LoadWritebackStore(resolvedEnv(t, store))
			require.NoError(t, err, "writebackstore")
			w, err := config.LoadWorker(resolvedEnv(t, fns["worker"]))
			require.NoError(t, err, "worker")
			require.Equal(t, s.settings.WriteBacks, w.Handlers.Writebacks)
		}
	}
}
