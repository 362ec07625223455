package stack

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The outbox relay: a bus per stage with a 90-day archive, an EventBridge
// endpoint admitting the worker only, events:PutEvents on that bus only,
// OUTBOX_BUS, two alarms, a dashboard row, outputs.
func TestOutboxRelay(t *testing.T) {
	t.Parallel()
	busID, bus := dev.one(t, "AWS::Events::EventBus", "OutboxBus")
	require.Equal(t, "StripeInbox-dev-outbox", props(bus)["Name"])
	require.Equal(t, "StripeInbox-prod-outbox", props(first(prod.resources("AWS::Events::EventBus")))["Name"], "one bus per stage")

	_, archive := dev.one(t, "AWS::Events::Archive", "OutboxBus")
	require.Equal(t, 90.0, props(archive)["RetentionDays"])
	require.Equal(t, map[string]any{"Fn::GetAtt": []any{busID, "Arn"}}, props(archive)["SourceArn"])

	// The worker publishes to this bus: OUTBOX_BUS is its name.
	fns := dev.appFunctions(t)
	require.Equal(t, map[string]any{"Ref": busID}, environment(fns["worker"])["OUTBOX_BUS"])
	for name, fn := range fns {
		if name != "worker" {
			require.NotContains(t, environment(fn), "OUTBOX_BUS", name)
		}
	}

	// events:PutEvents on this bus, to the worker only.
	var granted []string
	for id, sts := range dev.statements() {
		for _, st := range sts {
			actions := asSlice(st["Action"])
			if !slices.ContainsFunc(actions, func(a any) bool { return strings.HasPrefix(a.(string), "events:") }) {
				continue
			}
			require.Equal(t, []any{"events:PutEvents"}, actions, id)
			require.Equal(t, []any{map[string]any{"Fn::GetAtt": []any{busID, "Arn"}}}, asSlice(st["Resource"]), id)
			granted = append(granted, id)
		}
	}
	require.Len(t, granted, 1)
	require.True(t, strings.HasPrefix(granted[0], "WorkerFunction"), granted)

	// No interface endpoint: the worker reaches EventBridge over IPv6
	// (TestNoInterfaceEndpointOrNATAndEveryAWSCallerLeavesOverIPv6).
	require.Empty(t, dev.resources("AWS::EC2::VPCEndpoint"))

	// Alarms on the worker's outbox gauges; missing data is breaching.
	for _, want := range []struct{ name, metric string }{
		{"StripeInbox-dev-OutboxBacklogAge", "OutboxOldestAgeSeconds"},
		{"StripeInbox-dev-OutboxNeedsReview", "OutboxNeedsReviewCount"},
	} {
		var found resource
		for _, a := range dev.resources("AWS::CloudWatch::Alarm") {
			if props(a)["AlarmName"] == want.name {
				found = a
			}
		}
		require.NotNil(t, found, want.name)
		require.Contains(t, asJSON(t, props(found)), `"MetricName":"`+want.metric+`"`)
		require.Equal(t, "breaching", props(found)["TreatMissingData"])
		require.NotEmpty(t, props(found)["AlarmActions"])
	}
	_, dash := dev.one(t, "AWS::CloudWatch::Dashboard", "Dashboard")
	body := asJSON(t, props(dash)["DashboardBody"])
	for _, m := range []string{"OutboxBacklogCount", "OutboxOldestAgeSeconds", "OutboxNeedsReviewCount", "OutboxPublished", "OutboxFenced"} { // graphs or Logs Insights
		require.Contains(t, body, m)
	}

	outputs := dev.template["Outputs"].(map[string]any)
	require.Equal(t, map[string]any{"Ref": busID}, outputs["OutboxBusName"].(map[string]any)["Value"])
	require.Equal(t, map[string]any{"Fn::GetAtt": []any{busID, "Arn"}}, outputs["OutboxBusArn"].(map[string]any)["Value"])
}

// outboxRelay=false removes all of it, and leaves OUTBOX_BUS unset (the
// worker's relay is off).
func TestOutboxRelayOff(t *testing.T) {
	t.Parallel()
	require.False(t, retired.settings.OutboxRelay)
	require.Empty(t, retired.resources("AWS::Events::EventBus"))
	require.Empty(t, retired.resources("AWS::Events::Archive"))
	require.Empty(t, retired.resources("AWS::EC2::VPCEndpoint"))
	require.NotContains(t, environment(retired.appFunctions(t)["worker"]), "OUTBOX_BUS")
	require.NotContains(t, asJSON(t, retired.template), "events:PutEvents")
	require.NotContains(t, asJSON(t, retired.template), "OutboxBacklogAge")
	require.NotContains(t, retired.template["Outputs"], "OutboxBusName")
}

func TestOutboxRelaySetting(t *testing.T) {
	t.Parallel()
	s, err := SettingsFromContext(func(string) any { return nil })
	require.NoError(t, err)
	require.True(t, s.OutboxRelay, "on by default")
	_, err = SettingsFromContext(func(k string) any {
		if k == "outboxRelay" {
			return "maybe"
		}
		return nil
	})
	require.ErrorContains(t, err, "outboxRelay")
}
