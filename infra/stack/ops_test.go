package stack

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripeevent"
)

// TestOpsFunction: inboxctl --stage finds the ops function by name; it runs
// in the VPC as inbox_ops (its own secret with the proxy, its own connect
// grant), has no URL, schedule or other trigger, an Errors alarm, and
// outputs naming it; the migrate step creates its role.
func TestOpsFunction(t *testing.T) {
	t.Parallel()
	id, fn := dev.one(t, "AWS::Lambda::Function", "OpsFunction")
	p := props(fn)
	require.Equal(t, "StripeInbox-dev-ops", p["FunctionName"])
	require.Equal(t, "StripeInbox-prod-ops", props(prod.appFunctions(t)["ops"])["FunctionName"])
	require.NotNil(t, p["VpcConfig"])
	require.Equal(t, 2.0, p["ReservedConcurrentExecutions"])
	env := environment(fn)
	require.Equal(t, map[string]any{"DB_USER": OpsUser, "MAX_ATTEMPTS": "10", "STRIPE_API_VERSION": stripeevent.DefaultAPIVersion, "DB_MAX_CONNS": "2"},
		pick(env, "DB_USER", "MAX_ATTEMPTS", "STRIPE_API_VERSION", "DB_MAX_CONNS"))
	require.Equal(t, environment(dev.appFunctions(t)["worker"])["MAX_ATTEMPTS"], env["MAX_ATTEMPTS"], "the worker's needs-review")
	require.Equal(t, stripeevent.DefaultAPIVersion, environment(dev.appFunctions(t)["worker"])["STRIPE_API_VERSION"])

	for _, u := range dev.resources("AWS::Lambda::Url") {
		require.NotEqual(t, map[string]any{"Fn::GetAtt": []any{id, "Arn"}}, props(u)["TargetFunctionArn"], "no URL")
	}
	for pid, perm := range dev.resources("AWS::Lambda::Permission") {
		require.NotContains(t, asJSON(t, props(perm)["FunctionName"]), id, "%s: nothing but IAM invokes it", pid)
	}
	migrate := environment(dev.appFunctions(t)["migrate"])
	secret, _ := dev.one(t, "AWS::SecretsManager::Secret", "OpsUserSecret")
	require.Equal(t, OpsUser, migrate["OPS_DB_USER"])
	require.Equal(t, map[string]any{"Ref": secret}, migrate["OPS_DB_SECRET_ARN"])

	outputs := dev.template["Outputs"].(map[string]any)
	require.Equal(t, map[string]any{"Ref": id}, outputs["OpsFunctionName"].(map[string]any)["Value"])
	require.Equal(t, map[string]any{"Fn::GetAtt": []any{id, "Arn"}}, outputs["OpsFunctionArn"].(map[string]any)["Value"])

	var names []string
	for _, a := range dev.resources("AWS::CloudWatch::Alarm") {
		names = append(names, props(a)["AlarmName"].(string))
	}
	require.NotContains(t, names, "StripeInbox-dev-OpsErrors", "the operator reads the error; nobody else acts on it")
	require.Contains(t, names, "StripeInbox-dev-ApiVersionDrift")
}

func TestSettingsStripeAPIVersion(t *testing.T) {
	t.Parallel()
	s, err := SettingsFromContext(func(k string) any { return map[string]any{"stripeApiVersion": "2025-03-31.basil"}[k] })
	require.NoError(t, err)
	require.Equal(t, "2025-03-31.basil", s.StripeAPIVersion)
	_, err = SettingsFromContext(func(k string) any { return map[string]any{"stripeApiVersion": "latest"}[k] })
	require.ErrorContains(t, err, `stripeApiVersion: "latest" is not a Stripe API version`)
}

// unnamedApiReleases (default book) reaches the worker as
// STRIPE_UNNAMED_RELEASES; another value is refused with what to set.
func TestSettingsUnnamedAPIReleases(t *testing.T) {
	t.Parallel()
	require.Equal(t, "book", environment(dev.appFunctions(t)["worker"])["STRIPE_UNNAMED_RELEASES"])
	s, err := SettingsFromContext(func(k string) any { return map[string]any{"unnamedApiReleases": "hold"}[k] })
	require.NoError(t, err)
	require.Equal(t, "hold", s.UnnamedAPIReleases)
	_, err = SettingsFromContext(func(k string) any { return map[string]any{"unnamedApiReleases": "ignore"}[k] })
	require.ErrorContains(t, err, `unnamedApiReleases: STRIPE_UNNAMED_RELEASES="ignore": must be "book"`)
}
