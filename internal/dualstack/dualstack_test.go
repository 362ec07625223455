package dualstack

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/invokeproof"
)

// setEnv gives Load a region and credentials and no custom endpoint.
func setEnv(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	for _, k := range []string{"AWS_USE_DUALSTACK_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS",
		"AWS_ENDPOINT_URL_SECRETS_MANAGER", "AWS_ENDPOINT_URL_EVENTBRIDGE", "AWS_ENDPOINT_URL_LAMBDA", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
}

// TestDualStackHosts resolves, with the pinned SDK's own endpoint rules and
// the options each client gets from Load, the host each client the project
// builds calls.
func TestDualStackHosts(t *testing.T) {
	setEnv(t)
	ctx := context.Background()
	cfg, err := Load(ctx)
	require.NoError(t, err)
	region := aws.String(cfg.Region)

	so := sts.NewFromConfig(cfg).Options()
	require.Equal(t, aws.DualStackEndpointStateEnabled, so.EndpointOptions.UseDualStackEndpoint)
	ep, err := sts.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, sts.EndpointParameters{Region: region, UseDualStack: aws.Bool(true)})
	require.NoError(t, err)
	require.Equal(t, "sts.us-east-1.api.aws", ep.URI.Host)

	mo := secretsmanager.NewFromConfig(cfg).Options()
	require.Equal(t, aws.DualStackEndpointStateEnabled, mo.EndpointOptions.UseDualStackEndpoint)
	ep, err = secretsmanager.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, secretsmanager.EndpointParameters{Region: region, UseDualStack: aws.Bool(true)})
	require.NoError(t, err)
	// In the aws partition the rules give Secrets Manager its standard host
	// for dual-stack (a dual-stack host, not an api.aws one).
	require.Equal(t, "secretsmanager.us-east-1.amazonaws.com", ep.URI.Host)

	eo := eventbridge.NewFromConfig(cfg).Options()
	require.Equal(t, aws.DualStackEndpointStateEnabled, eo.EndpointOptions.UseDualStackEndpoint)
	ep, err = eventbridge.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, eventbridge.EndpointParameters{Region: region, UseDualStack: aws.Bool(true)})
	require.NoError(t, err)
	require.Equal(t, "events.us-east-1.api.aws", ep.URI.Host)
	// With a global endpoint id PutEvents goes to another host (SigV4a);
	// the relay sets none.
	ep, err = eventbridge.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, eventbridge.EndpointParameters{
		Region: region, UseDualStack: aws.Bool(true), EndpointId: aws.String("abcde.veo"),
	})
	require.NoError(t, err)
	require.Equal(t, "abcde.veo.endpoint.events.api.aws", ep.URI.Host)

	// The EventBridge ingest function's queue (internal/bootstrap NewIngest).
	qo := sqs.NewFromConfig(cfg).Options()
	require.Equal(t, aws.DualStackEndpointStateEnabled, qo.EndpointOptions.UseDualStackEndpoint)
	ep, err = sqs.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, sqs.EndpointParameters{Region: region, UseDualStack: aws.Bool(true)})
	require.NoError(t, err)
	require.Equal(t, "sqs.us-east-1.api.aws", ep.URI.Host)

	lo := lambda.NewFromConfig(cfg).Options()
	require.Equal(t, aws.DualStackEndpointStateEnabled, lo.EndpointOptions.UseDualStackEndpoint)
	ep, err = lambda.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, lambda.EndpointParameters{Region: region, UseDualStack: aws.Bool(true)})
	require.NoError(t, err)
	require.Equal(t, "lambda.us-east-1.api.aws", ep.URI.Host)

	// The signers and verifiers of invoke proofs resolve the same STS host
	// (the host is signed).
	u, err := invokeproof.Endpoint(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, "sts.us-east-1.api.aws", u.Host)
}

// TestStandInTurnsDualStackOff: with a custom endpoint the SDK refuses
// dual-stack, so Load leaves it off and the stand-in is called.
func TestStandInTurnsDualStackOff(t *testing.T) {
	setEnv(t)
	t.Setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")
	ctx := context.Background()
	cfg, err := Load(ctx)
	require.NoError(t, err)
	require.Equal(t, aws.DualStackEndpointStateUnset, sts.NewFromConfig(cfg).Options().EndpointOptions.UseDualStackEndpoint)
	u, err := invokeproof.Endpoint(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9", u.Host)

	// What the SDK does with both: it refuses.
	_, err = sts.NewDefaultEndpointResolverV2().ResolveEndpoint(ctx, sts.EndpointParameters{
		Region: aws.String("us-east-1"), UseDualStack: aws.Bool(true), Endpoint: aws.String("http://127.0.0.1:9"),
	})
	require.ErrorContains(t, err, "Dualstack and custom endpoint are not supported")
}

func TestEnabled(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	require.True(t, Enabled(none, []string{"PATH=/bin", "AWS_REGION=us-east-1"}))
	require.True(t, Enabled(none, []string{"AWS_ENDPOINT_URL_STS="}), "an empty override is no override")
	require.False(t, Enabled(none, []string{"AWS_ENDPOINT_URL=http://127.0.0.1:4566"}))
	require.False(t, Enabled(none, []string{"AWS_ENDPOINT_URL_SECRETS_MANAGER=http://127.0.0.1:1"}))
	require.False(t, Enabled(func(k string) string {
		if k == "AWS_USE_DUALSTACK_ENDPOINT" {
			return "false"
		}
		return ""
	}, nil))
}
