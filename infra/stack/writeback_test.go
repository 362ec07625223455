package stack

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeBacks on (ebOnly): the sender outside the VPC may invoke exactly the
// store function and read exactly its key's secret, and never connects to
// the database; the store inside runs as its own user, admits only the
// sender's proofs and denies everyone else in its resource policy; the
// schedule runs the sender every minute; the worker records the intents;
// the migrate function creates the role; and the alarms watch the backlog.
func TestWritebacksOn(t *testing.T) {
	t.Parallel()
	s := ebOnly
	senderID, sender := s.one(t, "AWS::Lambda::Function", "WritebackFunction")
	storeID, store := s.one(t, "AWS::Lambda::Function", "WritebackstoreFunction")
	require.NotContains(t, props(sender), "VpcConfig")
	require.Contains(t, props(store), "VpcConfig")
	require.Equal(t, 1.0, props(sender)["ReservedConcurrentExecutions"])
	keyID, key := s.one(t, "AWS::SecretsManager::Secret", "StripeWritebackKey")
	require.Equal(t, WritebackKeyPlaceholder, props(key)["SecretString"])
	env := environment(sender)
	require.Equal(t, map[string]any{"Ref": storeID}, env["STORE_FUNCTION"])
	require.Equal(t, map[string]any{"Ref": keyID}, env["STRIPE_API_KEY_SECRET_ARN"])
	require.Equal(t, s.settings.StripeMode, env["STRIPE_MODE"])
	require.NotContains(t, env, "DB_PROXY_HOST")
	storeEnv := environment(store)
	require.Equal(t, WritebackUser, storeEnv["DB_USER"])
	require.Contains(t, asJSON(t, storeEnv["WRITEBACK_ROLE_ARN"]), "WritebackFunctionServiceRole")
	fns := s.appFunctions(t)
	require.Equal(t, "customer_metadata", environment(fns["worker"])["WRITEBACKS"])
	migrate := environment(fns["migrate"])
	require.Equal(t, WritebackUser, migrate["WRITEBACK_DB_USER"])
	require.NotEmpty(t, migrate["WRITEBACK_DB_SECRET_ARN"])
	_, secret := s.one(t, "AWS::SecretsManager::Secret", "WritebackUserSecret")
	require.Contains(t, asJSON(t, props(secret)), WritebackUser)

	// IAM: only the sender invokes the store, exactly it; the sender reads
	// its key and never the database.
	invokers, keyReaders := 0, 0
	for id, sts := range s.statements() {
		for _, st := range sts {
			actions, res := asJSON(t, st["Action"]), asJSON(t, st["Resource"])
			if strings.Contains(actions, "lambda:InvokeFunction") && strings.Contains(res, storeID) {
				invokers++
				require.True(t, strings.HasPrefix(id, "WritebackFunction"), id)
				require.Equal(t, `{"Fn::GetAtt":["`+storeID+`","Arn"]}`, res, "exactly the function, no version wildcard")
			}
			if strings.Contains(actions, "secretsmanager:GetSecretValue") && strings.Contains(res, keyID) {
				keyReaders++
				require.True(t, strings.HasPrefix(id, "WritebackFunction"), id)
			}
			if strings.HasPrefix(id, "WritebackFunction") {
				require.NotContains(t, actions, "rds-db:connect", "the sender never reaches the database")
			}
		}
	}
	require.Equal(t, 1, invokers)
	require.Equal(t, 1, keyReaders)
	_, policy := s.one(t, "AWS::Lambda::ResourcePolicy", "WritebackstoreInvokers")
	doc := asJSON(t, props(policy)["PolicyDocument"])
	require.Contains(t, doc, `"Effect":"Deny"`)
	require.Contains(t, doc, `"ArnNotEquals"`)
	require.Contains(t, doc, "WritebackFunctionServiceRole")

	// Its Invokes are recorded with the caller's identity
	// (cloudTrailDataEvents).
	_, trail := s.one(t, "AWS::CloudTrail::Trail", "AuditTrail")
	require.Contains(t, asJSON(t, props(trail)["EventSelectors"]), `{"Fn::GetAtt":["`+storeID+`","Arn"]}`)

	// The schedule: every minute, the sender.
	var scheduled bool
	for _, r := range s.resources("AWS::Events::Rule") {
		p := props(r)
		if p["ScheduleExpression"] == "rate(1 minute)" && strings.Contains(asJSON(t, p["Targets"]), senderID) {
			scheduled = true
		}
	}
	require.True(t, scheduled, "the sender runs every minute")

	// The alarms.
	_, waiting := s.one(t, "AWS::CloudWatch::Alarm", "WritebacksWaitingAlarm")
	require.Equal(t, "WritebacksOldestAgeSeconds", alarmMetric(t, waiting)["MetricName"])
	require.Equal(t, float64(WritebackOldestAgeAlarm), props(waiting)["Threshold"])
	require.Equal(t, "breaching", props(waiting)["TreatMissingData"])
	_, parked := s.one(t, "AWS::CloudWatch::Alarm", "WritebacksParkedAlarm")
	require.Equal(t, "WritebacksParked", alarmMetric(t, parked)["MetricName"])
	require.Equal(t, 0.0, props(parked)["Threshold"])
	_, refused := s.one(t, "AWS::CloudWatch::Alarm", "WritebackStoreRefusedAlarm")
	require.Equal(t, "InvokeProofRefused", alarmMetric(t, refused)["MetricName"])
	require.Contains(t, asJSON(t, alarmMetric(t, refused)["Dimensions"]), "writebackstore")
	s.one(t, "AWS::CloudWatch::Alarm", "WritebackErrorsAlarm")
	s.one(t, "AWS::CloudWatch::Alarm", "WritebackstoreErrorsAlarm")
	// The gauges the alarms read are published.
	require.Contains(t, environment(sender)["METRICS_PUBLISH"], "WritebacksOldestAgeSeconds")
	require.Contains(t, environment(sender)["METRICS_PUBLISH"], "WritebacksParked")
	require.Contains(t, environment(store)["METRICS_PUBLISH"], "InvokeProofRefused")
}

// writeBacks off (the default): nothing of it is created, and the worker
// records no intents.
func TestWritebacksOffCreatesNothing(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, natDev, retired, live} {
		raw, err := json.Marshal(s.template)
		require.NoError(t, err)
		for _, word := range []string{"Writeback", "writeback", WritebackUser, "WRITEBACKS"} {
			require.NotContains(t, string(raw), word, s.settings.Stage)
		}
	}
}

func TestWritebacksSetting(t *testing.T) {
	t.Parallel()
	_, err := SettingsFromContext(func(k string) any { return map[string]any{"writeBacks": "invoice_memo"}[k] })
	require.ErrorContains(t, err, `"invoice_memo" is not a write-back this release ships`)
	s, err := SettingsFromContext(func(k string) any { return map[string]any{"writeBacks": "customer_metadata"}[k] })
	require.NoError(t, err)
	require.Equal(t, []string{"customer_metadata"}, s.WriteBacks)
	s, err = SettingsFromContext(func(string) any { return nil })
	require.NoError(t, err)
	require.Empty(t, s.WriteBacks)
}

// alarmMetric is the metric an alarm on one labelled metric watches (in
// its Metrics list, as the CDK renders a metric with a label).
func alarmMetric(t *testing.T, alarm resource) map[string]any {
	t.Helper()
	ms := asSlice(props(alarm)["Metrics"])
	require.Len(t, ms, 1)
	return ms[0].(map[string]any)["MetricStat"].(map[string]any)["Metric"].(map[string]any)
}
