package stack

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The reconciler runs outside the VPC (it needs the internet, and there is
// no NAT gateway), may invoke exactly the store function and read exactly
// the key's secret, and never connects to the database; the store function
// runs inside the VPC as its own least-privileged user.
func TestReconcilerOutsideTheVPCStoreFunctionInside(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		fns := s.appFunctions(t)
		rec, store := props(fns["reconcile"]), props(fns["reconcilestore"])
		require.NotContains(t, rec, "VpcConfig")
		require.Contains(t, store, "VpcConfig")
		require.Equal(t, []any{"arm64"}, rec["Architectures"])
		require.Equal(t, 2.0, rec["ReservedConcurrentExecutions"])

		storeID, _ := s.one(t, "AWS::Lambda::Function", "ReconcilestoreFunction")
		keyID, key := s.one(t, "AWS::SecretsManager::Secret", "StripeApiKey")
		require.Equal(t, APIKeyPlaceholder, props(key)["SecretString"])
		env := environment(fns["reconcile"])
		require.Equal(t, map[string]any{"Ref": storeID}, env["STORE_FUNCTION"])
		require.Equal(t, map[string]any{"Ref": keyID}, env["STRIPE_API_KEY_SECRET_ARN"])
		require.Equal(t, s.settings.StripeMode, env["STRIPE_MODE"])
		require.Equal(t, s.settings.Endpoints[0], env["RECONCILE_ENDPOINT"])
		require.NotContains(t, env, "DB_PROXY_HOST")
		require.Equal(t, ReconcileUser, environment(fns["reconcilestore"])["DB_USER"])
		require.Equal(t, s.settings.Endpoints[0], environment(fns["reconcilestore"])["RECONCILE_ENDPOINTS"])

		// IAM: who may invoke the store function, and with what.
		invokers := 0
		for id, sts := range s.statements() {
			for _, st := range sts {
				actions := asJSON(t, st["Action"])
				if strings.Contains(actions, "lambda:InvokeFunction") && strings.Contains(asJSON(t, st["Resource"]), storeID) {
					invokers++
					require.True(t, strings.HasPrefix(id, "ReconcileFunction"), id)
					require.Equal(t, `{"Fn::GetAtt":["`+storeID+`","Arn"]}`, asJSON(t, st["Resource"]), "exactly the function, no version wildcard")
				}
				if strings.HasPrefix(id, "ReconcileFunction") {
					require.NotContains(t, actions, "rds-db:connect", "the reconciler never reaches the database")
				}
			}
		}
		require.Equal(t, 1, invokers)
		for _, perm := range s.resources("AWS::Lambda::Permission") {
			if fn, ok := props(perm)["FunctionName"].(map[string]any); ok && asJSON(t, fn) == `{"Fn::GetAtt":["`+storeID+`","Arn"]}` {
				t.Fatalf("the store function must have no resource-based permission: %v", perm)
			}
		}
		// The migrate function creates the store function's role.
		migrate := environment(fns["migrate"])
		require.Equal(t, ReconcileUser, migrate["RECONCILE_DB_USER"])
		require.NotEmpty(t, migrate["RECONCILE_DB_SECRET_ARN"])
	}
}

func TestReconcileScheduleAndAlarms(t *testing.T) {
	t.Parallel()
	recID, _ := dev.one(t, "AWS::Lambda::Function", "ReconcileFunction")
	found := false
	for _, rule := range dev.resources("AWS::Events::Rule") {
		p := props(rule)
		if strings.Contains(asJSON(t, p["Targets"]), recID) {
			found = true
			require.Equal(t, "rate(15 minutes)", p["ScheduleExpression"])
			require.Equal(t, "ENABLED", p["State"])
		}
	}
	require.True(t, found)

	names := map[string]map[string]any{}
	for _, alarm := range dev.resources("AWS::CloudWatch::Alarm") {
		p := props(alarm)
		names[p["AlarmName"].(string)] = p
	}
	missing := names["StripeInbox-dev-EventsFoundMissing"]
	require.NotNil(t, missing)
	require.Contains(t, asJSON(t, missing["Metrics"]), `"MetricName":"EventsFoundMissing"`)
	require.Contains(t, asJSON(t, missing["Metrics"]), `{"Name":"Service","Value":"reconcile"}`)
	require.Equal(t, 0.0, missing["Threshold"])
	require.Equal(t, "notBreaching", missing["TreatMissingData"])
	stale := names["StripeInbox-dev-ReconcileStale"]
	require.NotNil(t, stale)
	require.Equal(t, "breaching", stale["TreatMissingData"])
	require.Equal(t, "LessThanThreshold", stale["ComparisonOperator"])
	require.Contains(t, asJSON(t, stale["Metrics"]), `"Period":1800`)
	require.Contains(t, asJSON(t, stale["Metrics"]), `"MetricName":"ReconcileFailed"`)
	// A mark older than the Events API's 30 days is an alarm, not only a
	// log line.
	horizon := names["StripeInbox-dev-ReconcileBeyondHorizon"]
	require.NotNil(t, horizon)
	require.Contains(t, asJSON(t, horizon["Metrics"]), `"MetricName":"ReconcileWindowClamped"`)
	require.Equal(t, 0.0, horizon["Threshold"])
	require.Equal(t, "GreaterThanThreshold", horizon["ComparisonOperator"])
	require.Contains(t, names, "StripeInbox-dev-ReconcileErrors")
	require.Contains(t, names, "StripeInbox-dev-ReconcilestoreErrors")

	_, dash := dev.one(t, "AWS::CloudWatch::Dashboard", "Dashboard")
	body := asJSON(t, props(dash)["DashboardBody"])
	require.Contains(t, body, "events found missing")
	require.Contains(t, body, "found missing by type")
	require.Contains(t, body, "EventType", "the breakdown by type is a log field (Logs Insights)")
	require.Contains(t, body, "ReconcileMarkAgeSeconds")
}

func TestReconcileSettings(t *testing.T) {
	t.Parallel()
	s, err := SettingsFromContext(func(k string) any {
		return map[string]any{"endpoints": "billing,connect", "reconcileEndpoint": "connect", "reconcile": "false"}[k]
	})
	require.NoError(t, err)
	require.Equal(t, "connect", s.ReconcileEndpoint)
	require.False(t, s.Reconcile)
	_, err = SettingsFromContext(func(k string) any {
		return map[string]any{"reconcileEndpoint": "shop", "reconcileSchedule": "every 15 minutes"}[k]
	})
	require.ErrorContains(t, err, `reconcileEndpoint="shop": must be one of the endpoints [billing]`)
	require.ErrorContains(t, err, `reconcileSchedule="every 15 minutes"`)
}
