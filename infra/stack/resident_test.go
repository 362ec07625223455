package stack

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWorkerInvocationsOverlap: the configuration arithmetic of the
// resident worker, read back from the template: each invocation polls until
// its timeout minus DEADLINE_MARGIN, which is past the next tick of the
// schedule, and the reserved concurrency admits the overlapping invocations.
func TestWorkerInvocationsOverlap(t *testing.T) {
	t.Parallel()
	worker := natDev.appFunctions(t)["worker"] // workerPollInterval=250ms
	env := environment(worker)
	timeout := time.Duration(props(worker)["Timeout"].(float64)) * time.Second
	margin, err := time.ParseDuration(env["DEADLINE_MARGIN"].(string))
	require.NoError(t, err)
	poll, err := time.ParseDuration(env["POLL_INTERVAL"].(string))
	require.NoError(t, err)
	require.Positive(t, poll, "this stage's worker is resident")

	_, rule := natDev.one(t, "AWS::Events::Rule", "WorkerSchedule")
	period, ok := SchedulePeriod(props(rule)["ScheduleExpression"].(string))
	require.True(t, ok)
	require.Greater(t, timeout-margin, period, "consecutive invocations overlap: a poller is always live")
	reserved := props(worker)["ReservedConcurrentExecutions"].(float64)
	require.GreaterOrEqual(t, reserved, float64((timeout+period-1)/period), "the overlapping invocations are not throttled")
	require.Equal(t, 3.0, reserved)
}

// TestTheWebhookWakesTheWorker: by default the worker is not resident (each
// run returns when the inbox is empty) and the webhook invokes it
// asynchronously after each new receipt, allowed to invoke exactly the
// worker; the schedule stays; workerWake=false removes the wake.
func TestTheWebhookWakesTheWorker(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		fns := s.appFunctions(t)
		require.Equal(t, "0s", environment(fns["worker"])["POLL_INTERVAL"], "%s: not resident", s.settings.Stage)
		workerID := ""
		for id, r := range s.resources("AWS::Lambda::Function") {
			if asJSON(t, r) == asJSON(t, fns["worker"]) {
				workerID = id
			}
		}
		require.NotEmpty(t, workerID)
		require.Equal(t, map[string]any{"Ref": workerID}, environment(fns["webhook"])["WAKE_FUNCTION"], s.settings.Stage)
		require.Equal(t, 3.0, props(fns["worker"])["ReservedConcurrentExecutions"], "the reservation bounds the runs a burst of wakes starts")

		var invokes []string
		for policy, sts := range s.statements() {
			for _, st := range sts {
				if asJSON(t, st["Action"]) == `"lambda:InvokeFunction"` && strings.Contains(asJSON(t, st["Resource"]), workerID) {
					invokes = append(invokes, policy)
				}
			}
		}
		require.Len(t, invokes, 1, "%s: only the webhook may invoke the worker: %v", s.settings.Stage, invokes)
		require.True(t, strings.HasPrefix(invokes[0], "WebhookFunction"), invokes)
		_, rule := s.one(t, "AWS::Events::Rule", "WorkerSchedule")
		require.Equal(t, "rate(1 minute)", props(rule)["ScheduleExpression"], "the schedule is the safety net")
	}
	require.NotContains(t, environment(retired.appFunctions(t)["webhook"]), "WAKE_FUNCTION")
}

// TestEventBridgeReceiptsWakeTheWorker: the ingest function starts a worker
// run after a drain that stored receipts, as the webhook does after each
// (without it they would wait for the schedule), and may invoke exactly the
// worker.
func TestEventBridgeReceiptsWakeTheWorker(t *testing.T) {
	t.Parallel()
	workerID, _ := ebOnly.one(t, "AWS::Lambda::Function", "WorkerFunction")
	_, ingest := ebOnly.one(t, "AWS::Lambda::Function", "IngestFunction")
	require.Equal(t, map[string]any{"Ref": workerID}, environment(ingest)["WAKE_FUNCTION"])
	var invokes []string
	for policy, sts := range ebOnly.statements() {
		for _, st := range sts {
			if asJSON(t, st["Action"]) == `"lambda:InvokeFunction"` && strings.Contains(asJSON(t, st["Resource"]), workerID) {
				invokes = append(invokes, policy)
			}
		}
	}
	slices.Sort(invokes)
	require.Len(t, invokes, 2, "the webhook and the ingest function: %v", invokes)
	require.True(t, strings.HasPrefix(invokes[0], "IngestFunction"), invokes)
	require.True(t, strings.HasPrefix(invokes[1], "WebhookFunction"), invokes)
}

// TestListenIsASetting: LISTEN (worker) and NOTIFY (webhook) are off by
// default and on together with workerListen.
func TestListenIsASetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    *synthesized
		want string
	}{{dev, "off"}, {prod, "off"}, {natDev, "on"}} {
		fns := tc.s.appFunctions(t)
		require.Equal(t, tc.want, environment(fns["worker"])["LISTEN"], tc.s.settings.Stage)
		require.Equal(t, tc.want, environment(fns["webhook"])["NOTIFY"], tc.s.settings.Stage)
	}
}

// TestLatencyMetricWidgetAndOptionalAlarm: the dashboard shows the
// receipt-to-effect p50 and p99; the p99 alarm exists only when
// latencyP99Alarm is set.
func TestLatencyMetricWidgetAndOptionalAlarm(t *testing.T) {
	t.Parallel()
	_, dash := dev.one(t, "AWS::CloudWatch::Dashboard", "Dashboard")
	body := asJSON(t, props(dash)["DashboardBody"])
	require.Contains(t, body, "ReceiptToEffectSeconds")
	require.Contains(t, body, `\"stat\":\"p50\"`)
	require.Contains(t, body, `\"stat\":\"p99\"`)

	latencyAlarms := func(s *synthesized) []map[string]any {
		var out []map[string]any
		for _, a := range s.resources("AWS::CloudWatch::Alarm") {
			p := props(a)
			for _, m := range asSlice(p["Metrics"]) {
				stat, ok := m.(map[string]any)["MetricStat"].(map[string]any)
				if !ok {
					continue // a math expression (OtherModeOnly's)
				}
				if stat["Metric"].(map[string]any)["MetricName"] == "ReceiptToEffectSeconds" {
					require.Equal(t, "p99", stat["Stat"])
					require.Equal(t, 300.0, stat["Period"])
					out = append(out, p)
				}
			}
		}
		return out
	}
	require.Empty(t, latencyAlarms(dev), "off by default")
	require.Empty(t, latencyAlarms(prod), "off by default")
	got := latencyAlarms(natDev)
	require.Len(t, got, 1)
	require.Equal(t, 10.0, got[0]["Threshold"])
	require.Equal(t, 3.0, got[0]["EvaluationPeriods"])
	require.Equal(t, "notBreaching", got[0]["TreatMissingData"])
	require.Equal(t, "StripeInbox-natdev-ReceiptLatency", got[0]["AlarmName"])
}
