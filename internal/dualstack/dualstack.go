// Package dualstack loads the AWS SDK configuration every binary of the
// project uses, with the SDK's dual-stack endpoints turned on, so that a
// call to AWS leaves the VPC over IPv6 (the stack's egress-only internet
// gateway) rather than through an interface endpoint or a NAT gateway.
//
// Why one place: the functions in the VPC have no IPv4 route out (no NAT,
// no interface endpoints, infra/stack/network.go), so a client that
// resolves an IPv4-only host (secretsmanager.REGION.amazonaws.com) cannot
// connect at all. And the invoke proofs (internal/invokeproof) are
// presigned for an STS host that the verifier in the VPC must call: the
// signers (the reconciler, inboxctl) and the verifiers (the store and ops
// functions) must resolve the same host, so they load their configuration
// here too.
//
// The hosts, as aws-sdk-go-v2's endpoint rules build them with UseDualStack
// (service/*/endpoints.go: "https://<service>." + region + "." +
// PartitionResult.DualStackDnsSuffix, "api.aws" in the aws partition);
// TestDualStackHosts resolves each with the pinned SDK:
//
//	sts.REGION.api.aws            (IAM guide, "AWS STS dual-stack endpoint support")
//	secretsmanager.REGION.amazonaws.com (the rules' aws-partition case:
//	                              Secrets Manager's standard host is its
//	                              dual-stack one there; api.aws elsewhere)
//	events.REGION.api.aws         (EventBridge guide, "Dual-stack service endpoints")
//	lambda.REGION.api.aws
//
// PutEvents with a global endpoint id (EndpointId) resolves to
// ID.endpoint.events.api.aws and signs with SigV4a; internal/outbox sets no
// EndpointId, so the relay calls the regional host above.
//
// A custom endpoint (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_<SERVICE>: the
// stand-ins of the tests and the local runner) turns dual-stack off: the
// SDK refuses the two together ("Invalid Configuration: Dualstack and
// custom endpoint are not supported", the same rules), and a stand-in on
// loopback needs no IPv6 route anyway. AWS_USE_DUALSTACK_ENDPOINT=false
// turns it off by hand (a region without the dual-stack hosts; the
// functions in the VPC then cannot reach AWS).
package dualstack

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
)

// Load is awsconfig.LoadDefaultConfig with dual-stack endpoints on unless
// Enabled(os.Getenv) says otherwise.
func Load(ctx context.Context, optFns ...func(*awsconfig.LoadOptions) error) (aws.Config, error) {
	opts := []func(*awsconfig.LoadOptions) error{}
	if Enabled(os.Getenv, os.Environ()) {
		opts = append(opts, awsconfig.WithUseDualStackEndpoint(aws.DualStackEndpointStateEnabled))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, append(opts, optFns...)...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("loading AWS configuration: %w", err)
	}
	return cfg, nil
}

// Enabled reports whether the clients use the dual-stack endpoints: yes,
// unless AWS_USE_DUALSTACK_ENDPOINT is false or any AWS_ENDPOINT_URL* is
// set (environ is os.Environ()'s form, KEY=VALUE).
func Enabled(getenv func(string) string, environ []string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("AWS_USE_DUALSTACK_ENDPOINT")), "false") {
		return false
	}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if (k == "AWS_ENDPOINT_URL" || strings.HasPrefix(k, "AWS_ENDPOINT_URL_")) && v != "" {
			return false
		}
	}
	return true
}
