package stack

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestALiveStageOfAnyNameIsProtected: data protection follows
// stripeMode=live, not the stage's name. A live stage called "production"
// keeps its ledger on `cdk destroy` exactly as "prod" does; a test-mode
// stage does not.
func TestALiveStageOfAnyNameIsProtected(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{prod, live} {
		stage := s.settings.Stage
		require.Equal(t, "live", s.settings.StripeMode, stage)
		_, db := s.one(t, "AWS::RDS::DBInstance", "Database")
		require.Equal(t, true, props(db)["DeletionProtection"], stage)
		require.Equal(t, "Snapshot", db["DeletionPolicy"], stage)
		require.Equal(t, "Snapshot", db["UpdateReplacePolicy"], stage)
		require.Equal(t, true, props(db)["MultiAZ"], stage)
		require.Equal(t, 14.0, props(db)["BackupRetentionPeriod"], stage)
		for id, group := range s.resources("AWS::Logs::LogGroup") {
			require.Equal(t, "Retain", group["DeletionPolicy"], "%s: %s", stage, id)
			require.Equal(t, 90.0, props(group)["RetentionInDays"], "%s: %s", stage, id)
		}
		for _, prefix := range []string{"SigningSecretBilling", "StripeApiKey"} {
			_, secret := s.one(t, "AWS::SecretsManager::Secret", prefix)
			require.Equal(t, "Retain", secret["DeletionPolicy"], "%s: %s", stage, prefix)
		}
		_, bus := s.one(t, "AWS::Events::EventBus", "OutboxBus")
		require.Equal(t, "Retain", bus["DeletionPolicy"], stage)
		// cdk-nag's RDS checks are not waived for a live stage.
		for id, r := range s.template["Resources"].(map[string]any) {
			nag := asJSON(t, r.(map[string]any)["Metadata"])
			for _, rule := range []string{"AwsSolutions-RDS3", "AwsSolutions-RDS10"} {
				require.NotContains(t, nag, rule, "%s: %s waives %s", stage, id, rule)
			}
		}
	}
	_, db := dev.one(t, "AWS::RDS::DBInstance", "Database")
	require.Equal(t, false, props(db)["DeletionProtection"])
	require.Equal(t, "Delete", db["DeletionPolicy"])
	require.Equal(t, 7.0, props(db)["BackupRetentionPeriod"])
}

// TestTheStoreFunctionAdmitsOnlyTheReconciler: the store function knows
// whose proofs to admit (the reconciler's role), its resource policy denies
// every other invoker, it may reach STS to verify, and a refusal alarms.
func TestTheStoreFunctionAdmitsOnlyTheReconciler(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		storeID, _ := s.one(t, "AWS::Lambda::Function", "ReconcilestoreFunction")
		_, rec := s.one(t, "AWS::Lambda::Function", "ReconcileFunction")
		role := props(rec)["Role"] // {"Fn::GetAtt": [roleID, "Arn"]}
		require.Equal(t, role, environment(s.appFunctions(t)["reconcilestore"])["RECONCILER_ROLE_ARN"])

		_, policy := s.one(t, "AWS::Lambda::ResourcePolicy", "ReconcilestoreInvokers")
		require.Equal(t, map[string]any{"Fn::GetAtt": []any{storeID, "Arn"}}, props(policy)["ResourceArn"])
		doc := props(policy)["PolicyDocument"].(map[string]any)
		sts := doc["Statement"].([]any)
		require.Len(t, sts, 1)
		st := sts[0].(map[string]any)
		require.Equal(t, "Deny", st["Effect"])
		require.Equal(t, "*", st["Principal"])
		require.Equal(t, "lambda:InvokeFunction", st["Action"])
		require.Contains(t, asJSON(t, st["Resource"]), `":*"`, "versions and aliases too")
		require.Equal(t, map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": role}}, st["Condition"])
	}
}

// TestTheOutboxBusAcceptsEventsOnlyFromTheWorker: the bus's policy denies
// events:PutEvents to every principal but the worker's role. The
// statement's conditions are evaluated here for the principals that matter:
// another role of the account (a developer, CI) and a user are denied, the
// worker and AWS services acting as themselves (the archive's replays) are
// not.
func TestTheOutboxBusAcceptsEventsOnlyFromTheWorker(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		busID, _ := s.one(t, "AWS::Events::EventBus", "OutboxBus")
		policies := s.resources("AWS::Events::EventBusPolicy")
		require.Len(t, policies, 1, s.settings.Stage)
		p := props(first(policies))
		require.Equal(t, map[string]any{"Ref": busID}, p["EventBusName"])
		st := p["Statement"].(map[string]any)
		require.Equal(t, "Deny", st["Effect"])
		require.Equal(t, map[string]any{"AWS": "*"}, st["Principal"])
		require.Equal(t, "events:PutEvents", st["Action"])
		require.Equal(t, map[string]any{"Fn::GetAtt": []any{busID, "Arn"}}, st["Resource"])

		_, worker := s.one(t, "AWS::Lambda::Function", "WorkerFunction")
		workerRole := asJSON(t, props(worker)["Role"])
		cond := st["Condition"].(map[string]any)
		denied := func(principalArn string, isService bool) bool {
			notWorker := asJSON(t, cond["ArnNotEquals"].(map[string]any)["aws:PrincipalArn"]) != principalArn
			notService := cond["BoolIfExists"].(map[string]any)["aws:PrincipalIsAWSService"] == map[bool]string{true: "true", false: "false"}[isService]
			require.Len(t, cond, 2, "no other condition")
			return notWorker && notService
		}
		require.False(t, denied(workerRole, false), "the worker puts events")
		require.True(t, denied(`"arn:aws:iam::123456789012:role/Developer"`, false), "another role is denied")
		require.True(t, denied(`"arn:aws:iam::123456789012:user/ci"`, false), "a user is denied")
		require.False(t, denied(`"events.amazonaws.com"`, true), "EventBridge's own replays are not")
	}
	require.Empty(t, retired.resources("AWS::Events::EventBusPolicy"), "no bus, no policy")
}

// TestFunctionSecurityGroupsHaveNoAllTrafficEgress: each function in the
// VPC may reach RDS Proxy on 5432, and HTTPS to ::/0 (AWS's dual-stack
// hosts, through the egress-only gateway) only if it calls AWS; nothing
// else, and never all traffic or any IPv4 address.
func TestFunctionSecurityGroupsHaveNoAllTrafficEgress(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, natDev, retired} {
		want := map[string][]string{
			"webhook":        {"443 ::/0", "5432 Proxy"},
			"worker":         {"443 ::/0", "5432 Proxy"},
			"purge":          {"5432 Proxy"},
			"migrate":        {"443 ::/0", "5432 Proxy"},
			"ops":            {"443 ::/0", "5432 Proxy"},
			"reconcilestore": {"443 ::/0", "5432 Proxy"},
		}
		if !s.settings.OutboxRelay {
			want["worker"] = []string{"5432 Proxy"}
		}
		proxySG, _ := s.one(t, "AWS::EC2::SecurityGroup", "ProxySecurityGroup")
		egress := s.resources("AWS::EC2::SecurityGroupEgress")
		for name, fn := range s.appFunctions(t) {
			if name == "reconcile" {
				continue // outside the VPC
			}
			sgs := props(fn)["VpcConfig"].(map[string]any)["SecurityGroupIds"].([]any)
			require.Len(t, sgs, 1, name)
			sgID := sgs[0].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
			sg := props(s.resources("AWS::EC2::SecurityGroup")[sgID])
			var got []string
			for _, rule := range asSlice(sg["SecurityGroupEgress"]) {
				r := rule.(map[string]any)
				if r["CidrIp"] == "255.255.255.255/32" {
					continue // CDK's placeholder for "no egress"
				}
				require.NotContains(t, r, "CidrIp", "%s %s: IPv4 egress %v", s.settings.Stage, name, r)
				require.Equal(t, "tcp", r["IpProtocol"], name)
				require.Equal(t, r["FromPort"], r["ToPort"], name)
				got = append(got, strings.TrimSuffix(asJSON(t, r["FromPort"]), ".0")+" "+r["CidrIpv6"].(string))
			}
			for id, e := range egress {
				p := props(e)
				if asJSON(t, p["GroupId"]) != asJSON(t, map[string]any{"Fn::GetAtt": []any{sgID, "GroupId"}}) {
					continue
				}
				require.Equal(t, "tcp", p["IpProtocol"], id)
				require.Equal(t, p["FromPort"], p["ToPort"], id)
				require.NotContains(t, p, "CidrIp", id)
				require.NotContains(t, p, "CidrIpv6", id)
				dest := p["DestinationSecurityGroupId"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
				require.Equal(t, proxySG, dest, id)
				got = append(got, strings.TrimSuffix(asJSON(t, p["FromPort"]), ".0")+" Proxy")
			}
			slices.Sort(got)
			require.Equal(t, want[name], got, "%s: %s's egress", s.settings.Stage, name)
		}
	}
}

// TestScrubbingIsOn: processed receipts lose their payload after a week by
// default (the purge's SCRUB_PAYLOAD_AFTER_DAYS), and the setting is
// checked against the retention.
func TestScrubbingIsOn(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, live} {
		require.Equal(t, "7", environment(s.appFunctions(t)["purge"])["SCRUB_PAYLOAD_AFTER_DAYS"], s.settings.Stage)
	}
	for _, tc := range []struct {
		context map[string]any
		want    int
	}{
		{map[string]any{"scrubPayloadAfterDays": "14"}, 14},
		{map[string]any{"scrubPayloadAfterDays": "0"}, 0},
		{map[string]any{"retentionDays": "7"}, 0}, // gone within the week anyway
		{map[string]any{"retentionDays": "8"}, 7},
	} {
		s, err := SettingsFromContext(lookup(tc.context))
		require.NoError(t, err, tc.context)
		require.Equal(t, tc.want, s.ScrubPayloadAfterDays, tc.context)
	}
	for _, bad := range []map[string]any{
		{"scrubPayloadAfterDays": "3"},
		{"scrubPayloadAfterDays": "30"}, // not before the purge (30 days)
		{"scrubPayloadAfterDays": "week"},
	} {
		_, err := SettingsFromContext(lookup(bad))
		require.ErrorContains(t, err, "scrubPayloadAfterDays=", bad)
	}
}

// TestRejectedAndRefusedRequestsAlarm: the webhook's rejected requests and
// the store function's refused ones each have an alarm.
func TestRejectedAndRefusedRequestsAlarm(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		found := map[string]bool{}
		for _, alarm := range s.resources("AWS::CloudWatch::Alarm") {
			p := props(alarm)
			name := p["AlarmName"].(string)
			for alarmName, metric := range map[string]string{"WebhookRejected": `"MetricName":"Rejected"`, "ReconcileStoreRefused": `"MetricName":"InvokeProofRefused"`} {
				if name != s.settings.StackName()+"-"+alarmName {
					continue
				}
				found[alarmName] = true
				m := asJSON(t, p["Metrics"])
				require.Contains(t, m, metric, name)
				require.NotContains(t, m, `"Name":"Reason"`, "%s: the total, not one reason", name)
				require.Equal(t, 0.0, p["Threshold"], name)
				require.Equal(t, "GreaterThanThreshold", p["ComparisonOperator"], name)
				require.NotEmpty(t, p["AlarmActions"], name)
			}
		}
		require.Equal(t, map[string]bool{"WebhookRejected": true, "ReconcileStoreRefused": true}, found, s.settings.Stage)
	}
}

// TestCloudTrailDataEventsOnLiveStages: a live stage records every Invoke of
// the ops and store functions (with the caller's identity) in a trail of
// its own, without management events (a second copy of those is billed);
// a test stage has no trail unless asked.
func TestCloudTrailDataEventsOnLiveStages(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{prod, live} {
		_, trail := s.one(t, "AWS::CloudTrail::Trail", "AuditTrail")
		p := props(trail)
		require.Equal(t, true, p["IsLogging"])
		require.Equal(t, true, p["EnableLogFileValidation"])
		selectors := asSlice(p["EventSelectors"])
		require.Len(t, selectors, 1)
		sel := selectors[0].(map[string]any)
		require.Equal(t, false, sel["IncludeManagementEvents"])
		resources := asSlice(sel["DataResources"])
		require.Len(t, resources, 1)
		require.Equal(t, "AWS::Lambda::Function", resources[0].(map[string]any)["Type"])
		opsID, _ := s.one(t, "AWS::Lambda::Function", "OpsFunction")
		storeID, _ := s.one(t, "AWS::Lambda::Function", "ReconcilestoreFunction")
		require.ElementsMatch(t, []any{
			map[string]any{"Fn::GetAtt": []any{opsID, "Arn"}},
			map[string]any{"Fn::GetAtt": []any{storeID, "Arn"}},
		}, resources[0].(map[string]any)["Values"])
		_, bucket := s.one(t, "AWS::S3::Bucket", "AuditTrailBucket")
		require.Equal(t, "Retain", bucket["DeletionPolicy"])
		require.Contains(t, s.template["Outputs"], "AuditTrailBucketName")
	}
	require.Empty(t, dev.resources("AWS::CloudTrail::Trail"))
	s, err := SettingsFromContext(lookup(map[string]any{"cloudTrailDataEvents": "true"}))
	require.NoError(t, err)
	require.True(t, s.CloudTrailDataEvents)
	s, err = SettingsFromContext(lookup(map[string]any{"stage": "prod", "cloudTrailDataEvents": "false"}))
	require.NoError(t, err)
	require.False(t, s.CloudTrailDataEvents)
}

func TestLegacyAndLiveSettings(t *testing.T) {
	t.Parallel()
	s, err := SettingsFromContext(lookup(map[string]any{"keepLegacyAppRole": "true"}))
	require.NoError(t, err)
	require.False(t, s.RetireLegacyAppRole)
	s, err = SettingsFromContext(lookup(map[string]any{"retireLegacyAppRole": "true"}))
	require.NoError(t, err)
	require.True(t, s.RetireLegacyAppRole, "the former opt-in is the default now")
	_, err = SettingsFromContext(lookup(map[string]any{"retireLegacyAppRole": "false"}))
	require.ErrorContains(t, err, "deploy once with keepLegacyAppRole=true")
	_, err = SettingsFromContext(lookup(map[string]any{"keepLegacyAppRole": "yes please"}))
	require.ErrorContains(t, err, "keepLegacyAppRole=yes please: must be true or false (default false)")
	_, err = SettingsFromContext(lookup(map[string]any{"stripeMode": "live", "multiAz": "false"}))
	require.ErrorContains(t, err, "multiAz=false: a stripeMode=live stage runs Multi-AZ")
}
