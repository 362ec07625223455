package stack

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// synthesized is one stack of the test app, synthesized once for the whole
// test binary (jsii runs the CDK in a node process; a synth takes seconds).
type synthesized struct {
	settings  Settings
	template  map[string]any
	nagErrors []string
}

// The stacks every test reads: dev (two endpoints, an alarm e-mail), prod
// (defaults), dev with nat=true, the resident worker and keepLegacyAppRole=true
// (the one upgrade deploy), dev with the former retireLegacyAppRole=true,
// outboxRelay=false and workerWake=false, a live stage that is not called prod, and a stage
// whose events all come through EventBridge, with write-backs on (ebOnly).
var dev, prod, natDev, retired, live, ebOnly *synthesized

func TestMain(m *testing.M) {
	// The machine's Node 20 is past jsii's end of support (2026-10-30); the
	// banner it prints on every start is noise in test output. CI should move
	// to Node 22.
	if os.Getenv("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION") == "" {
		os.Setenv("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
	}
	code, err := synthesizeAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "synth:", err)
		os.Exit(1)
	}
	os.Exit(code(m))
}

func synthesizeAll() (func(*testing.M) int, error) {
	defer jsii.Close()
	started := time.Now()
	assets, err := os.MkdirTemp("", "inbox-assets-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(assets)
	for _, name := range append(slices.Clip(Functions), "ingest", "writeback", "writebackstore") {
		if err := os.MkdirAll(filepath.Join(assets, name), 0o755); err != nil {
			return nil, err
		}
		// Distinct content per function, so each gets its own asset hash.
		if err := os.WriteFile(filepath.Join(assets, name, "bootstrap"), []byte("placeholder "+name), 0o755); err != nil {
			return nil, err
		}
	}
	outdir, err := os.MkdirTemp("", "inbox-cdk-out-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(outdir)

	flags, err := featureFlags()
	if err != nil {
		return nil, err
	}
	// Collect nag errors as annotations (TestNagFindings lists them) instead
	// of failing the synth, which `cdk synth` does with this flag on.
	flags["@aws-cdk/core:annotationsInValidationReport"] = false
	app := awscdk.NewApp(&awscdk.AppProps{Context: &flags, Outdir: jsii.String(outdir)})

	variants := []struct {
		into    **synthesized
		context map[string]any
	}{
		{&dev, map[string]any{"stage": "dev", "endpoints": "billing,connect", "alarmEmail": "ops@example.com"}},
		{&prod, map[string]any{"stage": "prod"}},
		{&retired, map[string]any{"stage": "retired", "retireLegacyAppRole": "true", "outboxRelay": "false", "workerWake": "false"}},
		{&natDev, map[string]any{"stage": "natdev", "nat": "true", "workerListen": "true", "workerPollInterval": "250ms", "latencyP99Alarm": "10s", "keepLegacyAppRole": "true"}},
		{&live, map[string]any{"stage": "production", "stripeMode": "live"}},
		{&ebOnly, map[string]any{"stage": "eb", "endpoints": "billing,connect", "functionUrl": "false", "writeBacks": "customer_metadata", "cloudTrailDataEvents": "true",
			"eventBridgeSources": "aws.partner/stripe.com/ed_test_1=billing,aws.partner/stripe.com/ed_test_2=connect"}},
	}
	stacks := make([]awscdk.Stack, len(variants))
	for i, v := range variants {
		v.context["assetsDir"] = assets
		settings, err := SettingsFromContext(func(k string) any { return v.context[k] })
		if err != nil {
			return nil, err
		}
		stack, err := NewInboxStack(app, settings.StackName(), &InboxStackProps{Settings: settings})
		if err != nil {
			return nil, err
		}
		awscdk.Aspects_Of(stack).Add(cdknag.NewAwsSolutionsChecks(nil), nil)
		stacks[i] = stack
		*v.into = &synthesized{settings: settings}
	}
	for i, v := range variants {
		tmpl := assertions.Template_FromStack(stacks[i], nil)
		raw, err := json.Marshal(tmpl.ToJSON())
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &(*v.into).template); err != nil {
			return nil, err
		}
		for _, msg := range *assertions.Annotations_FromStack(stacks[i]).FindError(jsii.String("*"),
			assertions.Match_StringLikeRegexp(jsii.String("AwsSolutions-.*"))) {
			// FindError returns cxapi.SynthesisMessage (awscdk v2.276.0,
			// assertions/Annotations.go), deprecated as a whole with no Go
			// replacement to read instead.
			(*v.into).nagErrors = append((*v.into).nagErrors, fmt.Sprintf("%s: %v", *msg.Id, msg.Entry.Data)) //nolint:staticcheck // SA1019, see above
		}
	}
	fmt.Fprintf(os.Stderr, "synthesized %d stacks in %s\n", len(stacks), time.Since(started).Round(100*time.Millisecond))
	return func(m *testing.M) int { return m.Run() }, nil
}

// featureFlags are the context of infra/cdk.json, so tests synthesize with
// the same feature flags as `cdk synth`.
func featureFlags() (map[string]any, error) {
	raw, err := os.ReadFile(filepath.Join("..", "cdk.json"))
	if err != nil {
		return nil, err
	}
	var cdkJSON struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(raw, &cdkJSON); err != nil {
		return nil, fmt.Errorf("infra/cdk.json: %w", err)
	}
	return cdkJSON.Context, nil
}

func TestNagFindings(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, natDev, retired, live, ebOnly} {
		for _, e := range s.nagErrors {
			t.Errorf("%s: %s", s.settings.Stage, e)
		}
	}
}
