package stack

import (
	"slices"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudtrail"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/jsii-runtime-go"
)

// The paths around the Stripe signature (docs/security.md): nothing but
// Stripe's signed deliveries and the reconciler's listing of Stripe's own
// Events API may put a receipt in the inbox, only the worker may publish to
// the outbox bus, and an operator's change names the person who made it.
//
//   - The store function serves only requests proven to come from the
//     reconciler's role (internal/invokeproof: a presigned
//     sts:GetCallerIdentity bound to the request), verified against STS's
//     dual-stack host over IPv6 (the signer signs for the same host,
//     internal/dualstack); its resource policy also denies every other
//     invoker. A refusal is counted (InvokeProofRefused) and alarmed.
//   - The ops function learns its caller's verified IAM identity the same
//     way.
//   - The outbox bus denies PutEvents to everyone but the worker's role.
//   - A CloudTrail trail of the stack's own records every Invoke of the ops
//     and store functions with the caller's identity (cloudTrailDataEvents).
//
// Cost (us-east-1 list prices; scripts/cost prices the template): the route
// to STS is the egress-only gateway, free; GetCallerIdentity is free. The trail's data events are $0.10 per
// 100,000 (the store function is invoked a few times per 15-minute run, the
// ops function by hand: about 30,000 a month, $0.03), and its S3 bucket
// holds kilobytes (cents a month for the PUTs of the log files). The
// policies and alarms are free (two alarms: $0.20).

// securitySettings reads scrubPayloadAfterDays, cloudTrailDataEvents and
// checks what a live stage requires.
func (r *reader) securitySettings(s *Settings) {
	def := 0
	if s.RetentionDays > DefaultScrubPayloadAfterDays {
		def = DefaultScrubPayloadAfterDays
	}
	s.ScrubPayloadAfterDays = r.integer("scrubPayloadAfterDays", def, 0, 3650)
	if n := s.ScrubPayloadAfterDays; n != 0 && (n < 4 || n >= s.RetentionDays) {
		r.addf("scrubPayloadAfterDays=%d: must be 0 (off) or from 4 (past Stripe's 3-day retries) to less than retentionDays (%d)", n, s.RetentionDays)
	}
	s.CloudTrailDataEvents = r.boolean("cloudTrailDataEvents", s.Protected())
	if s.Protected() && !s.MultiAZ {
		r.addf("multiAz=false: a stripeMode=live stage runs Multi-AZ (cdk-nag AwsSolutions-RDS3 is waived only for test-mode stages); remove the setting")
	}
}

// DefaultScrubPayloadAfterDays is how long a processed receipt keeps its
// payload by default: a week to look at it (inboxctl show --payload), then
// only its keys and outcome stay until the purge deletes the row.
const DefaultScrubPayloadAfterDays = 7

// stripeMode reads stripeMode (default live for stage prod, test
// otherwise). It is read first: the data protection defaults follow it.
func (r *reader) stripeMode(stage string) string {
	def := "test"
	if stage == "prod" {
		def = "live"
	}
	mode := r.str("stripeMode", def)
	if !slices.Contains(StripeModes, mode) {
		r.addf("stripeMode=%q: must be live (book live-mode events: real money) or test (book test-mode events); default live for stage prod, test otherwise", mode)
		return def
	}
	return mode
}

// legacyAppRole reads keepLegacyAppRole (default false: inbox_app is
// retired) and the former retireLegacyAppRole (true is the default now;
// false is refused, as it would keep the shared login forever).
func (r *reader) legacyAppRole(s *Settings) {
	keep := r.boolean("keepLegacyAppRole", false)
	if _, set := r.raw("retireLegacyAppRole"); set && !r.boolean("retireLegacyAppRole", true) {
		r.addf("retireLegacyAppRole=false: the shared login inbox_app is now retired by default; to upgrade from the release that used it, " +
			"deploy once with keepLegacyAppRole=true, then again without it (docs/deployment.md)")
	}
	s.RetireLegacyAppRole = !keep
}

// security builds what the comment above describes. It runs once every
// function exists.
func (b *builder) security() {
	b.storeInvokers()
	b.outboxBusPolicy()
	if b.s.CloudTrailDataEvents {
		b.dataEvents()
	}
	if !b.s.RetireLegacyAppRole {
		awscdk.Annotations_Of(b.stack).AddWarningV2(jsii.String("stripe-inbox:keepLegacyAppRole"), jsii.String(
			"keepLegacyAppRole=true keeps the shared database login inbox_app (all rights on every table) and lets the webhook, worker and purge "+
				"roles connect as it. Use it for exactly one deploy, the upgrade from the release that used it; deploy again without it."), nil)
	}
}

// storeInvokers tells the reconciler's store function whose proofs to admit
// (RECONCILER_ROLE_ARN) and denies lambda:InvokeFunction on it to every
// principal but the reconciler's role (onlyCallerInvokes).
func (b *builder) storeInvokers() {
	b.onlyCallerInvokes(b.functions["reconcilestore"], b.functions["reconcile"], "RECONCILER_ROLE_ARN", "ReconcilestoreInvokers", "OnlyTheReconcilerInvokes")
}

// outboxBusPolicy denies events:PutEvents on the outbox bus to every
// principal but the worker's role (an explicit Deny in the bus's policy
// takes precedence over an identity-based Allow), so a consumer can trust
// that an event on it came from the ledger. AWS services acting as
// themselves (the archive's replays) are not denied.
func (b *builder) outboxBusPolicy() {
	if b.bus == nil {
		return
	}
	b.bus.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyTheWorkerPutsEvents"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("events:PutEvents"),
		Resources:  &[]*string{b.bus.EventBusArn()},
		Conditions: &map[string]any{
			"ArnNotEquals": map[string]any{"aws:PrincipalArn": b.functions["worker"].Role().RoleArn()},
			"BoolIfExists": map[string]any{"aws:PrincipalIsAWSService": "false"},
		},
	}))
}

// dataEvents is a trail of the stack's own that records the Invoke data
// events of the ops and store functions (who invoked, when, with which
// request id: ops_audit.request_id finds the call) and no management
// events (the account's own trail, if any, has those; a second copy of
// management events is billed). Its bucket is kept when the stack is
// deleted: an audit trail outlives what it audits.
func (b *builder) dataEvents() {
	bucket := awss3.NewBucket(b.stack, jsii.String("AuditTrailBucket"), &awss3.BucketProps{
		BlockPublicAccess: awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:        awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		Versioned:         jsii.Bool(true),
		RemovalPolicy:     awscdk.RemovalPolicy_RETAIN,
	})
	suppress(bucket, false, suppression{
		id: "AwsSolutions-S1",
		reason: "The bucket holds only CloudTrail's log files of this stack's trail, written by CloudTrail and validated with " +
			"digest files; S3 server access logs would need a second bucket that logs reads of the first",
	})
	trail := awscloudtrail.NewTrail(b.stack, jsii.String("AuditTrail"), &awscloudtrail.TrailProps{
		Bucket:                     bucket,
		IncludeGlobalServiceEvents: jsii.Bool(false),
		IsMultiRegionTrail:         jsii.Bool(false),
		EnableFileValidation:       jsii.Bool(true),
		ManagementEvents:           awscloudtrail.ReadWriteType_NONE,
	})
	audited := []awslambda.IFunction{b.functions["ops"], b.functions["reconcilestore"]}
	if fn, ok := b.functions["writebackstore"]; ok {
		audited = append(audited, fn) // writeBacks on (writeback.go)
	}
	trail.AddLambdaEventSelector(&audited, &awscloudtrail.AddEventSelectorOptions{
		IncludeManagementEvents: jsii.Bool(false),
		ReadWriteType:           awscloudtrail.ReadWriteType_ALL,
	})
	awscdk.NewCfnOutput(b.stack, jsii.String("AuditTrailBucketName"), &awscdk.CfnOutputProps{
		Description: jsii.String("CloudTrail data events (Invoke) of the ops and store functions, with the caller's identity"),
		Value:       bucket.BucketName(),
	})
}

// securityAlarms: a request to the store function that was not the
// reconciler's, and webhook requests refused before storing (anything but
// a valid, signed Stripe delivery).
func (b *builder) securityAlarms() []alarmSpec {
	notBreaching := awscloudwatch.TreatMissingData_NOT_BREACHING
	return []alarmSpec{
		{
			id: "ReconcileStoreRefusedAlarm",
			description: "The reconciler's store function refused a request not proven to come from the reconciler's role (InvokeProofRefused; " +
				"the log line \"store request refused\" has the reason and the signer). Somebody other than the reconciler invoked it: " +
				"find who in the stack's CloudTrail (AuditTrailBucketName, Invoke events of the store function) and remove their " +
				"lambda:InvokeFunction. Nothing was stored. (Once, during the upgrade that introduced proofs, the previous reconciler's " +
				"unproven requests are refused: that is expected.)",
			metric:    b.emf("reconcilestore", "InvokeProofRefused", "Sum"),
			threshold: 0, periods: 1, missing: notBreaching,
		},
		{
			id: "WebhookRejectedAlarm",
			description: "The webhook refused requests (Rejected; by Reason on the dashboard and in the log): bad_signature or signature_too_old " +
				"after a signing-secret roll or with a wrong secret (Stripe retries: fix it within 3 days), unknown_endpoint (a Stripe endpoint " +
				"pointed at a wrong path), body_too_large or malformed_event, or requests that are not Stripe's (anything on the internet may " +
				"reach the Function URL; docs/security.md on CloudFront and WAF).",
			metric:    b.emf("webhook", "Rejected", "Sum"),
			threshold: 0, periods: 1, missing: notBreaching,
		},
	}
}
