package stack

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A stage whose endpoints come through EventBridge: a partner bus and a
// rule per source, the rule's targets (the queue and the doorbell) each
// with a retry policy and the dead-letter queue, the queue's redrive
// policy and its policy admitting only the rules, the dead-letter alarm,
// the ingest function's grants and database user, and no Function URL.
func TestEventBridgeIngest(t *testing.T) {
	t.Parallel()
	s := ebOnly
	buses := s.resources("AWS::Events::EventBus")
	var names []string
	for _, b := range buses {
		if n, ok := props(b)["EventSourceName"].(string); ok {
			names = append(names, n)
			require.Equal(t, n, props(b)["Name"], "a partner bus is named after its source")
		}
	}
	require.ElementsMatch(t, []string{"aws.partner/stripe.com/ed_test_1", "aws.partner/stripe.com/ed_test_2"}, names)

	queueID, queue := s.one(t, "AWS::SQS::Queue", "IngestQueue")
	dlqID, _ := s.one(t, "AWS::SQS::Queue", "IngestDeadLetterQueue")
	redrive := props(queue)["RedrivePolicy"].(map[string]any)
	require.Equal(t, float64(IngestMaxReceives), redrive["maxReceiveCount"])
	require.Equal(t, asJSON(t, map[string]any{"Fn::GetAtt": []any{dlqID, "Arn"}}), asJSON(t, redrive["deadLetterTargetArn"]))
	fnID, fn := s.one(t, "AWS::Lambda::Function", "IngestFunction")
	require.Contains(t, props(fn), "VpcConfig")
	env := environment(fn)
	require.Equal(t, IngestUser, env["DB_USER"])
	require.Equal(t, "aws.partner/stripe.com/ed_test_1=billing,aws.partner/stripe.com/ed_test_2=connect", env["EVENTBRIDGE_SOURCES"])

	rules := 0
	for _, r := range s.resources("AWS::Events::Rule") {
		p := props(r)
		if _, ok := p["EventBusName"]; !ok {
			continue
		}
		rules++
		require.Contains(t, asJSON(t, p["EventPattern"]), `aws.partner/stripe.com/ed_test_`)
		targets := asSlice(p["Targets"])
		require.Len(t, targets, 2)
		for _, tg := range targets {
			tg := tg.(map[string]any)
			require.NotNil(t, tg["RetryPolicy"], "every target has a retry policy")
			require.Equal(t, asJSON(t, map[string]any{"Arn": map[string]any{"Fn::GetAtt": []any{dlqID, "Arn"}}}), asJSON(t, tg["DeadLetterConfig"]))
		}
		arns := asJSON(t, targets[0].(map[string]any)["Arn"]) + asJSON(t, targets[1].(map[string]any)["Arn"])
		require.Contains(t, arns, queueID)
		require.Contains(t, arns, fnID)
	}
	require.Equal(t, 2, rules)

	// Only the rules may send to the queue.
	var deny bool
	for _, p := range s.resources("AWS::SQS::QueuePolicy") {
		if !strings.Contains(asJSON(t, props(p)["Queues"]), queueID) {
			continue
		}
		for _, st := range asSlice(props(p)["PolicyDocument"].(map[string]any)["Statement"]) {
			st := st.(map[string]any)
			if st["Effect"] == "Deny" && strings.Contains(asJSON(t, st["Action"]), "sqs:SendMessage") {
				deny = true
				require.Contains(t, asJSON(t, st["Condition"]), "ArnNotEquals")
				require.Contains(t, asJSON(t, st["Condition"]), "aws:SourceArn")
			}
		}
	}
	require.True(t, deny, "the queue's policy denies every sender but the rules")

	// The function's grants: consume the queue, send to the dead-letter
	// queue (a refusal), connect as its own user; nothing else of SQS.
	var consume, sendDLQ bool
	for id, sts := range s.statements() {
		for _, st := range sts {
			actions, res := asJSON(t, st["Action"]), asJSON(t, st["Resource"])
			if strings.Contains(actions, "sqs:ReceiveMessage") {
				require.True(t, strings.HasPrefix(id, "IngestFunction"), id)
				require.Contains(t, res, queueID)
				consume = true
			}
			if strings.HasPrefix(id, "IngestFunction") && strings.Contains(actions, "sqs:SendMessage") {
				require.Contains(t, res, dlqID)
				require.NotContains(t, res, queueID)
				sendDLQ = true
			}
		}
	}
	require.True(t, consume)
	require.True(t, sendDLQ)
	require.Equal(t, IngestUser, environment(s.appFunctions(t)["migrate"])["INGEST_DB_USER"])

	_, alarm := s.one(t, "AWS::CloudWatch::Alarm", "IngestDeadLetterAlarm")
	require.Equal(t, "ApproximateNumberOfMessagesVisible", props(alarm)["MetricName"])
	require.Empty(t, s.resources("AWS::Lambda::Url"), "functionUrl=false: no public URL")
	require.Len(t, dev.resources("AWS::Lambda::Url"), 1)
	require.Empty(t, dev.resources("AWS::SQS::Queue"), "no sources, no ingest")
}

func TestEventBridgeSettings(t *testing.T) {
	t.Parallel()
	for ctx, want := range map[string]string{
		`{"functionUrl":"false"}`:                                "functionUrl=false leaves no way in",
		`{"eventBridgeSources":"aws.events=billing"}`:            `"aws.events" is not a Stripe partner event source`,
		`{"eventBridgeSources":"aws.partner/stripe.com/ed_1=B"}`: `must be source=endpoint`,
	} {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(ctx), &m))
		_, err := SettingsFromContext(func(k string) any { return m[k] })
		require.ErrorContains(t, err, want, ctx)
	}
	s, err := SettingsFromContext(func(k string) any {
		return map[string]any{"eventBridgeSources": map[string]any{"aws.partner/stripe.com/ed_1": "billing"}}[k]
	})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"aws.partner/stripe.com/ed_1": "billing"}, s.EventBridgeSources)
	require.True(t, s.FunctionURL)
}
