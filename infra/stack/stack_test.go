package stack

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/database"
	"github.com/stripe-inbox/inbox/internal/secrets"
)

// The assertions below read the synthesized templates as plain JSON (see
// main_test.go), so a failure is an ordinary test failure with a message,
// not a panic from the jsii process.

type resource = map[string]any

func (s *synthesized) resources(typ string) map[string]resource {
	out := map[string]resource{}
	for id, r := range s.template["Resources"].(map[string]any) {
		if r := r.(map[string]any); r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// one returns the only resource of typ whose logical ID starts with prefix.
func (s *synthesized) one(t *testing.T, typ, prefix string) (string, resource) {
	t.Helper()
	var ids []string
	for id := range s.resources(typ) {
		if strings.HasPrefix(id, prefix) {
			ids = append(ids, id)
		}
	}
	require.Len(t, ids, 1, "want exactly one %s named %s*, got %v", typ, prefix, ids)
	return ids[0], s.resources(typ)[ids[0]]
}

func props(r resource) map[string]any { return r["Properties"].(map[string]any) }

// appFunctions are the project's four functions (the template also holds
// CDK's own custom-resource providers), keyed by name.
func (s *synthesized) appFunctions(t *testing.T) map[string]resource {
	t.Helper()
	out := map[string]resource{}
	for _, name := range Functions {
		_, r := s.one(t, "AWS::Lambda::Function", OutputID(name)+"Function")
		out[name] = r
	}
	return out
}

func environment(r resource) map[string]any {
	env, _ := props(r)["Environment"].(map[string]any)
	vars, _ := env["Variables"].(map[string]any)
	return vars
}

func dependsOn(r resource) []string {
	var out []string
	switch d := r["DependsOn"].(type) {
	case string:
		out = append(out, d)
	case []any:
		for _, x := range d {
			out = append(out, x.(string))
		}
	}
	return out
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	return string(raw)
}

func TestProxyRequiresTLSAndIAMAuth(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, natDev} {
		_, proxy := s.one(t, "AWS::RDS::DBProxy", "Proxy")
		p := props(proxy)
		require.Equal(t, true, p["RequireTLS"])
		require.Equal(t, "POSTGRESQL", p["EngineFamily"])
		require.Equal(t, ProxyName(s.settings.StackName()), p["DBProxyName"])
		auth := p["Auth"].([]any)
		if s.settings.RetireLegacyAppRole {
			require.Len(t, auth, 6, "the master's secret and one per function's user (ops and the reconciler's store function's too)")
		} else {
			require.Len(t, auth, 7, "the master's secret, one per function's user, and the earlier release's shared user's")
		}
		for _, a := range auth {
			require.Equal(t, "REQUIRED", a.(map[string]any)["IAMAuth"])
			require.Equal(t, "SECRETS", a.(map[string]any)["AuthScheme"])
		}
		for _, fn := range []string{"webhook", "worker", "purge", "reconcile"} {
			secret, _ := s.one(t, "AWS::SecretsManager::Secret", OutputID(fn)+"UserSecret")
			require.Contains(t, asJSON(t, auth), `{"Ref":"`+secret+`"}`, fn)
			require.Contains(t, asJSON(t, props(s.resources("AWS::SecretsManager::Secret")[secret])["GenerateSecretString"]),
				`\"username\":\"`+functionUsers[fn]+`\"`, fn)
		}
		if s.settings.RetireLegacyAppRole {
			continue
		}
		// With keepLegacyAppRole=true the earlier release's secret stays,
		// as it was: the same logical ID (so CloudFormation neither
		// replaces nor deletes it, and the password the role has stays
		// valid) and the same user.
		app := s.resources("AWS::SecretsManager::Secret")[legacySecretID]
		require.NotNil(t, app, "the shared user's secret is kept with keepLegacyAppRole=true")
		require.Contains(t, asJSON(t, props(app)["GenerateSecretString"]), `\"username\":\"`+LegacyAppUser+`\"`)
		require.Contains(t, asJSON(t, auth), `{"Ref":"`+legacySecretID+`"}`)
	}
	require.NotEqual(t, props(first(dev.resources("AWS::RDS::DBProxy")))["DBProxyName"],
		props(first(prod.resources("AWS::RDS::DBProxy")))["DBProxyName"], "proxy names are per stack")
}

// legacySecretID is the logical ID the earlier release's template gave the
// shared user's secret: CDK derives it from the construct path
// (AppUserSecret/Resource, the first 8 hex digits of its MD5), which the
// stack keeps. A different ID would make CloudFormation create a new secret
// with a new password and delete the one the previous functions use.
const legacySecretID = "AppUserSecret4AC93B38"

// TestNoRoleMayConnectAsTheSharedLoginByDefault: by default (and with the
// former retireLegacyAppRole=true) the shared user's secret is not in the
// proxy or the stack, no role may connect as it, and the migrate function
// retires it (RETIRED_DB_USERS). Only keepLegacyAppRole=true, for the one
// upgrade deploy, keeps it, with a synth warning.
func TestNoRoleMayConnectAsTheSharedLoginByDefault(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, retired, live} {
		require.True(t, s.settings.RetireLegacyAppRole, s.settings.Stage)
		_, proxy := s.one(t, "AWS::RDS::DBProxy", "Proxy")
		auth := props(proxy)["Auth"].([]any)
		require.Len(t, auth, 6, "the master's secret and one per function's user (ops and the reconciler's store function's too)")
		require.NotContains(t, s.resources("AWS::SecretsManager::Secret"), legacySecretID)
		for id, secret := range s.resources("AWS::SecretsManager::Secret") {
			require.NotContains(t, asJSON(t, props(secret)), LegacyAppUser, id)
		}
		for id, sts := range s.statements() {
			require.NotContains(t, asJSON(t, sts), "/"+LegacyAppUser+`"`, "%s: %s may connect as the shared login", s.settings.Stage, id)
		}
		migrate := environment(s.appFunctions(t)["migrate"])
		require.Equal(t, LegacyAppUser, migrate["RETIRED_DB_USERS"])
		require.NotContains(t, migrate, "LEGACY_DB_USER")
		require.NotContains(t, migrate, "LEGACY_DB_SECRET_ARN")
		// Nothing else changes: the functions keep their own users.
		for name, fn := range s.appFunctions(t) {
			require.Equal(t, environment(natDev.appFunctions(t)[name])["DB_USER"], environment(fn)["DB_USER"], name)
		}
	}
	// The upgrade deploy keeps it working.
	require.False(t, natDev.settings.RetireLegacyAppRole)
	migrate := environment(natDev.appFunctions(t)["migrate"])
	require.Equal(t, LegacyAppUser, migrate["LEGACY_DB_USER"])
	require.NotContains(t, migrate, "RETIRED_DB_USERS")
}

func first(m map[string]resource) resource {
	for _, r := range m {
		return r
	}
	return nil
}

func TestDatabaseIsPrivateEncryptedAndForcesTLS(t *testing.T) {
	t.Parallel()
	_, db := dev.one(t, "AWS::RDS::DBInstance", "Database")
	p := props(db)
	require.Equal(t, false, p["PubliclyAccessible"])
	require.Equal(t, true, p["StorageEncrypted"])
	require.Equal(t, "postgres", p["Engine"])
	require.True(t, p["EngineVersion"].(string) >= "17", "PostgreSQL 17 or newer, got %v", p["EngineVersion"])
	require.Equal(t, MasterUser, p["MasterUsername"])
	require.Equal(t, DatabaseName, p["DBName"])
	require.GreaterOrEqual(t, p["BackupRetentionPeriod"], 7.0)
	require.Contains(t, asJSON(t, p["MasterUserPassword"]), "{{resolve:secretsmanager:")

	paramsID, params := dev.one(t, "AWS::RDS::DBParameterGroup", "DatabaseParameters")
	require.Equal(t, map[string]any{"Ref": paramsID}, p["DBParameterGroupName"])
	require.Equal(t, "1", props(params)["Parameters"].(map[string]any)["rds.force_ssl"])

	// The DB subnets (and the proxy's) are isolated: no route out.
	_, group := dev.one(t, "AWS::RDS::DBSubnetGroup", "DatabaseSubnetGroup")
	subnets := dev.resources("AWS::EC2::Subnet")
	for _, ref := range props(group)["SubnetIds"].([]any) {
		subnet := subnets[ref.(map[string]any)["Ref"].(string)]
		require.Contains(t, asJSON(t, props(subnet)["Tags"]), `{"Key":"aws-cdk:subnet-type","Value":"Isolated"}`)
	}
}

func TestFunctionsRunArm64AL2023InTheVPC(t *testing.T) {
	t.Parallel()
	logGroups := dev.resources("AWS::Logs::LogGroup")
	for name, fn := range dev.appFunctions(t) {
		p := props(fn)
		if name == "reconcile" {
			continue // outside the VPC: TestReconcilerOutsideTheVPCStoreFunctionInside
		}
		require.Equal(t, []any{"arm64"}, p["Architectures"], name)
		require.Equal(t, "provided.al2023", p["Runtime"], name)
		require.Equal(t, "bootstrap", p["Handler"], name)
		vpc, ok := p["VpcConfig"].(map[string]any)
		require.True(t, ok, "%s has no VpcConfig", name)
		require.Len(t, vpc["SubnetIds"], 2, name)
		require.NotEmpty(t, vpc["SecurityGroupIds"], name)
		logging := p["LoggingConfig"].(map[string]any)
		require.Equal(t, "JSON", logging["LogFormat"], name)
		group := logGroups[logging["LogGroup"].(map[string]any)["Ref"].(string)]
		require.Equal(t, 30.0, props(group)["RetentionInDays"], name)
	}
	require.Equal(t, 20.0, props(dev.appFunctions(t)["webhook"])["ReservedConcurrentExecutions"])
	require.Equal(t, 10.0, props(dev.appFunctions(t)["webhook"])["Timeout"])
	require.Equal(t, 100.0, props(dev.appFunctions(t)["worker"])["Timeout"])
}

func TestEnvironmentContract(t *testing.T) {
	t.Parallel()
	fns := dev.appFunctions(t)
	proxyID, _ := dev.one(t, "AWS::RDS::DBProxy", "Proxy")
	for name, fn := range fns {
		env := environment(fn)
		if name == "reconcile" {
			continue // no database (TestReconcilerOutsideTheVPCStoreFunctionInside)
		}
		require.Equal(t, map[string]any{"Fn::GetAtt": []any{proxyID, "Endpoint"}}, env["DB_PROXY_HOST"], name)
		require.Equal(t, "5432", env["DB_PROXY_PORT"], name)
		require.Equal(t, DatabaseName, env["DB_NAME"], name)
		require.Equal(t, "StripeInbox", env["METRICS_NAMESPACE"], name)
		require.Equal(t, "Stage=dev", env["METRICS_DIMENSIONS"], name)
		require.NotContains(t, env, "AWS_REGION", "%s: AWS_REGION is reserved; Lambda sets it", name)
		require.NotContains(t, env, "DATABASE_URL", name)
		wantUser := map[string]string{"webhook": WebhookUser, "worker": WorkerUser, "purge": PurgeUser, "migrate": MasterUser, "ops": OpsUser, "reconcilestore": ReconcileUser}[name]
		require.Equal(t, wantUser, env["DB_USER"], name)
	}

	webhook := environment(fns["webhook"])
	billing, _ := dev.one(t, "AWS::SecretsManager::Secret", "SigningSecretBilling")
	connect, _ := dev.one(t, "AWS::SecretsManager::Secret", "SigningSecretConnect")
	require.Equal(t, map[string]any{"Fn::Join": []any{"", []any{
		"billing=", map[string]any{"Ref": billing}, ",connect=", map[string]any{"Ref": connect},
	}}}, webhook["SIGNING_SECRET_ARNS"])
	require.Equal(t, "2", webhook["DB_MAX_CONNS"])

	require.Equal(t, map[string]any{
		"WORKER_CONCURRENCY": "4", "MAX_ATTEMPTS": "10", "LEASE": "2m", "STATEMENT_TIMEOUT": "2s",
		"DEADLINE_MARGIN": "30s", "DB_MAX_CONNS": "5", "STRIPE_MODE": "test",
	}, pick(environment(fns["worker"]), "WORKER_CONCURRENCY", "MAX_ATTEMPTS", "LEASE", "STATEMENT_TIMEOUT", "DEADLINE_MARGIN", "DB_MAX_CONNS", "STRIPE_MODE"))
	require.Equal(t, "live", environment(prod.appFunctions(t)["worker"])["STRIPE_MODE"], "prod books live money")
	for name, fn := range fns {
		// The reconciler checks its key's mode against it.
		if name != "worker" && name != "reconcile" {
			require.NotContains(t, environment(fn), "STRIPE_MODE", "%s does not start a worker", name)
		}
	}
	require.Equal(t, map[string]any{"RETENTION_DAYS": "30", "PURGE_BATCH_SIZE": "1000", "SCRUB_PAYLOAD_AFTER_DAYS": "7"},
		pick(environment(fns["purge"]), "RETENTION_DAYS", "PURGE_BATCH_SIZE", "SCRUB_PAYLOAD_AFTER_DAYS"))

	migrate := environment(fns["migrate"])
	require.Equal(t, map[string]any{
		"SCHEMA_OWNER_ROLE": SchemaOwnerRole, "WEBHOOK_DB_USER": WebhookUser, "WORKER_DB_USER": WorkerUser, "PURGE_DB_USER": PurgeUser,
		"RETIRED_DB_USERS": LegacyAppUser,
	}, pick(migrate, "SCHEMA_OWNER_ROLE", "WEBHOOK_DB_USER", "WORKER_DB_USER", "PURGE_DB_USER", "RETIRED_DB_USERS"))
	require.NotContains(t, migrate, "LEGACY_DB_USER", "the shared user is kept only with keepLegacyAppRole=true")
	kept := environment(natDev.appFunctions(t)["migrate"])
	require.Equal(t, map[string]any{"LEGACY_DB_USER": LegacyAppUser, "LEGACY_DB_SECRET_ARN": map[string]any{"Ref": legacySecretID}},
		pick(kept, "LEGACY_DB_USER", "LEGACY_DB_SECRET_ARN"))
	for _, fn := range []string{"webhook", "worker", "purge"} {
		secret, _ := dev.one(t, "AWS::SecretsManager::Secret", OutputID(fn)+"UserSecret")
		require.Equal(t, map[string]any{"Ref": secret}, migrate[strings.ToUpper(fn)+"_DB_SECRET_ARN"], fn)
	}
}

func pick(m map[string]any, keys ...string) map[string]any {
	out := map[string]any{}
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

func TestNoSecretValueInEnvironment(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, natDev} {
		for id, fn := range s.resources("AWS::Lambda::Function") {
			env := strings.ToLower(asJSON(t, environment(fn)))
			for _, bad := range []string{"whsec_", "password", "{{resolve:", "secretstring"} {
				require.NotContains(t, env, bad, "%s: environment carries a secret value", id)
			}
		}
	}
	// The placeholder the stack stores must be refused by the webhook, so
	// it cannot start until an operator puts the real secret in.
	_, err := secrets.Parse(SigningSecretPlaceholder)
	require.Error(t, err)
	_, err = secrets.APIKeyMode(APIKeyPlaceholder)
	require.Error(t, err, "the reconciler refuses the key's placeholder")
	for _, secret := range dev.resources("AWS::SecretsManager::Secret") {
		if v, ok := props(secret)["SecretString"].(string); ok {
			require.Contains(t, []string{SigningSecretPlaceholder, APIKeyPlaceholder}, v)
		}
	}
}

// statements returns every IAM statement in the template (policies and
// inline role policies) with the logical ID that holds it.
func (s *synthesized) statements() map[string][]map[string]any {
	out := map[string][]map[string]any{}
	add := func(id string, doc any) {
		for _, st := range doc.(map[string]any)["Statement"].([]any) {
			out[id] = append(out[id], st.(map[string]any))
		}
	}
	for id, p := range s.resources("AWS::IAM::Policy") {
		add(id, props(p)["PolicyDocument"])
	}
	for id, r := range s.resources("AWS::IAM::Role") {
		for _, p := range asSlice(props(r)["Policies"]) {
			add(id, p.(map[string]any)["PolicyDocument"])
		}
	}
	return out
}

func asSlice(v any) []any {
	switch x := v.(type) {
	case []any:
		return x
	case nil:
		return nil
	default:
		return []any{x}
	}
}

func TestIAMGrantsAreScoped(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, retired, natDev} {
		connectUsers := map[string][]string{}
		for id, sts := range s.statements() {
			for _, st := range sts {
				actions := asSlice(st["Action"])
				secretRead := slices.Contains(actions, any("secretsmanager:GetSecretValue"))
				dbConnect := slices.Contains(actions, any("rds-db:connect"))
				if !secretRead && !dbConnect {
					continue
				}
				for _, res := range asSlice(st["Resource"]) {
					if str, ok := res.(string); ok {
						require.NotContains(t, str, "*", "%s: %v granted on %q", id, actions, str)
					}
				}
				if dbConnect {
					for _, res := range asSlice(st["Resource"]) {
						resJSON := asJSON(t, res)
						found := 0
						for _, user := range []string{MasterUser, WebhookUser, WorkerUser, PurgeUser, OpsUser, ReconcileUser, LegacyAppUser, SchemaOwnerRole} {
							if strings.Contains(resJSON, `/`+user+`"`) {
								connectUsers[user] = append(connectUsers[user], id)
								found++
							}
						}
						require.Equal(t, 1, found, "%s: one named database user per rds-db:connect resource: %s", id, resJSON)
						require.NotContains(t, resJSON, `/*`, id)
					}
				}
			}
		}
		// Each database user is reachable by exactly one function: the one
		// it serves. Nobody connects as the owner role. Until it is
		// retired, the three functions that shared inbox_app may still
		// connect as it (the previous code serves during the deploy and
		// after a rollback); the migrate function never.
		for user, prefix := range map[string]string{
			MasterUser: "MigrateFunction", WebhookUser: "WebhookFunction", WorkerUser: "WorkerFunction", PurgeUser: "PurgeFunction",
			OpsUser:       "OpsFunction",
			ReconcileUser: "ReconcilestoreFunction",
		} {
			require.Len(t, connectUsers[user], 1, "%s: %v", user, connectUsers[user])
			require.True(t, strings.HasPrefix(connectUsers[user][0], prefix), "%s is granted to %v", user, connectUsers[user])
		}
		require.Empty(t, connectUsers[SchemaOwnerRole])
		if s.settings.RetireLegacyAppRole {
			require.Empty(t, connectUsers[LegacyAppUser])
			continue
		}
		legacy := slices.Clone(connectUsers[LegacyAppUser])
		for i, id := range legacy {
			legacy[i] = id[:strings.Index(id, "Function")]
		}
		slices.Sort(legacy)
		require.Equal(t, []string{"Purge", "Webhook", "Worker"}, legacy, connectUsers[LegacyAppUser])
	}
}

func TestOnlyTheWebhookHasAPublicURL(t *testing.T) {
	t.Parallel()
	webhookID, _ := dev.one(t, "AWS::Lambda::Function", "WebhookFunction")
	urls := dev.resources("AWS::Lambda::Url")
	require.Len(t, urls, 1)
	url := props(first(urls))
	require.Equal(t, "NONE", url["AuthType"])
	require.Equal(t, map[string]any{"Fn::GetAtt": []any{webhookID, "Arn"}}, url["TargetFunctionArn"])
	for id, perm := range dev.resources("AWS::Lambda::Permission") {
		if props(perm)["Principal"] == "*" {
			require.Equal(t, map[string]any{"Fn::GetAtt": []any{webhookID, "Arn"}}, props(perm)["FunctionName"], id)
		}
	}
}

func TestSchedules(t *testing.T) {
	t.Parallel()
	workerID, _ := dev.one(t, "AWS::Lambda::Function", "WorkerFunction")
	purgeID, _ := dev.one(t, "AWS::Lambda::Function", "PurgeFunction")
	targets := map[string]string{}
	for _, rule := range dev.resources("AWS::Events::Rule") {
		p := props(rule)
		for _, target := range p["Targets"].([]any) {
			arn := target.(map[string]any)["Arn"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
			targets[arn] = p["ScheduleExpression"].(string)
		}
	}
	reconcileID, _ := dev.one(t, "AWS::Lambda::Function", "ReconcileFunction")
	require.Equal(t, map[string]string{workerID: "rate(1 minute)", purgeID: "cron(15 3 * * ? *)", reconcileID: "rate(15 minutes)"}, targets)
}

// TestScheduledFunctionsDoNotRetryAsync: Lambda's own async retries (two by
// default, events queued up to six hours) are off for the functions
// EventBridge invokes, so the target's retry policy is the only retry.
func TestScheduledFunctionsDoNotRetryAsync(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		configs := map[string]map[string]any{}
		for id, c := range s.resources("AWS::Lambda::EventInvokeConfig") {
			p := props(c)
			fn := p["FunctionName"].(map[string]any)["Ref"].(string)
			require.NotContains(t, configs, fn, id)
			configs[fn] = p
		}
		workerID, _ := s.one(t, "AWS::Lambda::Function", "WorkerFunction")
		purgeID, _ := s.one(t, "AWS::Lambda::Function", "PurgeFunction")
		reconcileID, _ := s.one(t, "AWS::Lambda::Function", "ReconcileFunction")
		require.Len(t, configs, 3, "one async invoke config each for the worker, the purge and the reconciler")
		for id, maxAge := range map[string]float64{workerID: 60, purgeID: 3600, reconcileID: 600} {
			require.Contains(t, configs, id)
			require.Equal(t, 0.0, configs[id]["MaximumRetryAttempts"], id)
			require.Equal(t, maxAge, configs[id]["MaximumEventAgeInSeconds"], id)
			require.Equal(t, "$LATEST", configs[id]["Qualifier"], id)
		}
		for _, rule := range s.resources("AWS::Events::Rule") {
			for _, target := range props(rule)["Targets"].([]any) {
				policy := target.(map[string]any)["RetryPolicy"].(map[string]any)
				require.NotNil(t, policy["MaximumRetryAttempts"])
				require.NotNil(t, policy["MaximumEventAgeInSeconds"], "a bounded event age on the target too")
			}
		}
	}
}

// TestProxyIdleClientTimeoutMatchesThePool: the proxy drops a client
// connection idle as long as the pool would (internal/database), not after
// its 30-minute default, so frozen worker instances do not hold pinned
// sessions.
func TestProxyIdleClientTimeoutMatchesThePool(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		_, proxy := s.one(t, "AWS::RDS::DBProxy", "Proxy")
		require.Equal(t, database.MaxConnIdleTime.Seconds(), props(proxy)["IdleClientTimeout"])
		require.Less(t, database.MaxConnIdleTime, 30*time.Minute)
	}
}

func TestAlarms(t *testing.T) {
	t.Parallel()
	byMetric := map[string][]map[string]any{}
	for _, alarm := range dev.resources("AWS::CloudWatch::Alarm") {
		p := props(alarm)
		require.NotEmpty(t, p["AlarmActions"], p["AlarmName"])
		for _, m := range asSlice(p["Metrics"]) {
			stat, ok := m.(map[string]any)["MetricStat"].(map[string]any)
			if !ok {
				continue // a math expression over the metrics listed beside it
			}
			name := stat["Metric"].(map[string]any)["MetricName"].(string)
			byMetric[name] = append(byMetric[name], p)
		}
		if name, ok := p["MetricName"].(string); ok {
			byMetric[name] = append(byMetric[name], p)
		}
	}
	for metric, count := range map[string]int{
		"OldestUnprocessedAgeSeconds": 1, "NeedsReviewCount": 1, "AnomalyCount": 1, "StoreFailed": 1,
		"Url5xxCount": 1, "Errors": 5, "Throttles": 1, "UnexpectedApiVersion": 1, "FreeStorageSpace": 1, "DatabaseConnections": 1,
		"EventsFoundMissing": 1, "ReconcileWindowClamped": 1,
	} {
		require.Len(t, byMetric[metric], count, metric)
	}

	backlog := byMetric["OldestUnprocessedAgeSeconds"][0]
	require.Equal(t, "breaching", backlog["TreatMissingData"])
	require.Equal(t, 600.0, backlog["Threshold"])
	require.Equal(t, "GreaterThanThreshold", backlog["ComparisonOperator"])
	stat := backlog["Metrics"].([]any)[0].(map[string]any)["MetricStat"].(map[string]any)
	require.Equal(t, "Maximum", stat["Stat"])
	require.Equal(t, 300.0, stat["Period"])
	require.Equal(t, "StripeInbox", stat["Metric"].(map[string]any)["Namespace"])
	require.ElementsMatch(t, []any{
		map[string]any{"Name": "Service", "Value": "worker"},
		map[string]any{"Name": "Stage", "Value": "dev"},
	}, stat["Metric"].(map[string]any)["Dimensions"])

	// A stage that receives only the other mode's events for an hour (a
	// wrong stripeMode: every payment ignored) alarms.
	other := byMetric["IgnoredOtherMode"]
	require.Len(t, other, 1, "IgnoredOtherMode")
	require.Equal(t, "StripeInbox-dev-OtherModeOnly", other[0]["AlarmName"])
	require.Equal(t, "notBreaching", other[0]["TreatMissingData"])
	var expr string
	for _, m := range asSlice(other[0]["Metrics"]) {
		if e, ok := m.(map[string]any)["Expression"].(string); ok {
			expr = e
		} else {
			require.Equal(t, 3600.0, m.(map[string]any)["MetricStat"].(map[string]any)["Period"])
		}
	}
	require.Equal(t, "IF(other > 0 AND (applied + ignored) == 0, 1, 0)", expr)

	// No data from the worker means its counts are unknown: the review and
	// anomaly alarms fire then, as the backlog alarm does.
	for _, metric := range []string{"NeedsReviewCount", "AnomalyCount"} {
		require.Equal(t, "breaching", byMetric[metric][0]["TreatMissingData"], metric)
	}
	webhookID, _ := dev.one(t, "AWS::Lambda::Function", "WebhookFunction")
	var throttled []string
	for _, a := range byMetric["Throttles"] {
		for _, d := range asSlice(a["Dimensions"]) {
			throttled = append(throttled, asJSON(t, d.(map[string]any)["Value"]))
		}
	}
	require.Contains(t, throttled, asJSON(t, map[string]any{"Ref": webhookID}), "the webhook has a Throttles alarm")

	store := asJSON(t, byMetric["StoreFailed"][0])
	require.Contains(t, store, `{"Name":"Service","Value":"webhook"}`)
	require.Equal(t, "LessThanThreshold", byMetric["FreeStorageSpace"][0]["ComparisonOperator"])

	// The e-mail subscription exists only when alarmEmail is set.
	require.Len(t, dev.resources("AWS::SNS::Subscription"), 1)
	require.Empty(t, prod.resources("AWS::SNS::Subscription"))
}

// TestEachFunctionPublishesWhatTheAlarmsAndDashboardRead: METRICS_PUBLISH
// of each function lists exactly the custom metrics of its service that an
// alarm or a dashboard graph reads (each $0.30 a month); the rest stay in
// the log lines (the dashboard's Logs Insights widgets read them).
func TestEachFunctionPublishesWhatTheAlarmsAndDashboardRead(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, retired} {
		read := map[string]map[string]bool{}
		note := func(service, name string) {
			if read[service] == nil {
				read[service] = map[string]bool{}
			}
			read[service][name] = true
		}
		for _, a := range s.resources("AWS::CloudWatch::Alarm") {
			for _, m := range asSlice(props(a)["Metrics"]) {
				stat, ok := m.(map[string]any)["MetricStat"].(map[string]any)
				if !ok {
					continue
				}
				metric := stat["Metric"].(map[string]any)
				if metric["Namespace"] != "StripeInbox" {
					continue
				}
				for _, d := range asSlice(metric["Dimensions"]) {
					if d.(map[string]any)["Name"] == "Service" {
						note(d.(map[string]any)["Value"].(string), metric["MetricName"].(string))
					}
				}
			}
		}
		_, dash := s.one(t, "AWS::CloudWatch::Dashboard", "Dashboard")
		body := asJSON(t, props(dash)["DashboardBody"])
		require.NotContains(t, body, "SEARCH(", "a SEARCH reads metrics by an extra dimension, which are not published")
		for _, m := range regexp.MustCompile(`\\"StripeInbox\\",\\"([A-Za-z]+)\\",\\"Service\\",\\"([a-z]+)\\"`).FindAllStringSubmatch(body, -1) {
			note(m[2], m[1])
		}
		for name, fn := range s.appFunctions(t) {
			want := slices.Sorted(maps.Keys(read[name]))
			got := environment(fn)["METRICS_PUBLISH"]
			if len(want) == 0 {
				require.Equal(t, "none", got, "%s %s", s.settings.Stage, name)
				continue
			}
			require.Equal(t, strings.Join(want, ","), got, "%s %s", s.settings.Stage, name)
		}
	}
	require.Contains(t, environment(dev.appFunctions(t)["worker"])["METRICS_PUBLISH"], "ReceiptToEffectSeconds")
}

func TestDashboard(t *testing.T) {
	t.Parallel()
	_, dash := dev.one(t, "AWS::CloudWatch::Dashboard", "Dashboard")
	require.Equal(t, "StripeInbox-dev", props(dash)["DashboardName"])
	body := asJSON(t, props(dash)["DashboardBody"])
	for _, want := range []string{
		"stats sum(Received) as received", "Rejected",
		"Received", "Duplicate", "ListedCopyReplaced", "BacklogCount", "OldestUnprocessedAgeSeconds", "Processed", "Failed", "Ignored",
		"NeedsReviewCount", "AnomalyCount", "PurgedReceipts", "Duration", "Errors", "DatabaseConnections",
	} {
		require.Contains(t, body, want)
	}
}

func TestMigrationsRunBeforeTheFunctions(t *testing.T) {
	t.Parallel()
	triggerID, trigger := dev.one(t, "Custom::Trigger", "MigrateOnDeploy")
	after := dependsOn(trigger)
	for _, prefix := range []string{"Database", "Proxy", "ProxyProxyTargetGroup", "VpcEgressOnlyIgw", "VpcdataSubnet1DefaultRoute6", "VpcdataSubnet2DefaultRoute6", "ProxySecurityGroupfrom"} {
		require.True(t, slices.ContainsFunc(after, func(id string) bool { return strings.HasPrefix(id, prefix) }),
			"the trigger must run after %s*: %v", prefix, after)
	}
	dbID, _ := dev.one(t, "AWS::RDS::DBInstance", "Database")
	proxyID, _ := dev.one(t, "AWS::RDS::DBProxy", "Proxy")
	require.Contains(t, after, dbID)
	require.Contains(t, after, proxyID)

	// It invokes the migrate function's current version, so it re-runs
	// whenever that function (which embeds the migrations) changes.
	p := props(trigger)
	require.Equal(t, true, p["ExecuteOnHandlerChange"])
	require.Equal(t, "RequestResponse", p["InvocationType"])
	versionID := p["HandlerArn"].(map[string]any)["Ref"].(string)
	migrateID, _ := dev.one(t, "AWS::Lambda::Function", "MigrateFunction")
	version := dev.resources("AWS::Lambda::Version")[versionID]
	require.Equal(t, map[string]any{"Ref": migrateID}, props(version)["FunctionName"])

	for _, name := range []string{"Webhook", "Worker", "Purge", "Ops"} {
		_, fn := dev.one(t, "AWS::Lambda::Function", name+"Function")
		require.Contains(t, dependsOn(fn), triggerID, "%s must wait for the migrations", name)
	}
	_, migrate := dev.one(t, "AWS::Lambda::Function", "MigrateFunction")
	require.NotContains(t, dependsOn(migrate), triggerID)
}

func TestOutputs(t *testing.T) {
	t.Parallel()
	outputs := dev.template["Outputs"].(map[string]any)
	urlID, _ := dev.one(t, "AWS::Lambda::Url", "WebhookFunctionFunctionUrl")
	for _, ep := range []string{"billing", "connect"} {
		id := OutputID(ep)
		url := outputs["WebhookUrl"+id].(map[string]any)["Value"]
		require.Equal(t, map[string]any{"Fn::Join": []any{"", []any{
			map[string]any{"Fn::GetAtt": []any{urlID, "FunctionUrl"}}, ep,
		}}}, url)
		secretID, _ := dev.one(t, "AWS::SecretsManager::Secret", "SigningSecret"+id)
		require.Equal(t, map[string]any{"Ref": secretID}, outputs["SigningSecretArn"+id].(map[string]any)["Value"])
		require.Contains(t, outputs, "SigningSecretName"+id)
	}
	require.Equal(t, "StripeInbox-dev", outputs["DashboardName"].(map[string]any)["Value"])
	topicID, _ := dev.one(t, "AWS::SNS::Topic", "AlarmTopic")
	require.Equal(t, map[string]any{"Ref": topicID}, outputs["AlarmTopicArn"].(map[string]any)["Value"])
	require.Contains(t, outputs, "MigrateFunctionName")
}

func TestProdIsProtected(t *testing.T) {
	t.Parallel()
	_, devDB := dev.one(t, "AWS::RDS::DBInstance", "Database")
	_, prodDB := prod.one(t, "AWS::RDS::DBInstance", "Database")

	require.Equal(t, false, props(devDB)["DeletionProtection"])
	require.Equal(t, false, props(devDB)["MultiAZ"])
	require.Equal(t, "Delete", devDB["DeletionPolicy"])

	require.Equal(t, true, props(prodDB)["DeletionProtection"])
	require.Equal(t, true, props(prodDB)["MultiAZ"])
	require.Equal(t, "Snapshot", prodDB["DeletionPolicy"])
	require.Equal(t, "Snapshot", prodDB["UpdateReplacePolicy"])
	require.Equal(t, 14.0, props(prodDB)["BackupRetentionPeriod"])
	for id, group := range prod.resources("AWS::Logs::LogGroup") {
		require.Equal(t, "Retain", group["DeletionPolicy"], id)
	}
	require.Equal(t, "Stage=prod", environment(prod.appFunctions(t)["worker"])["METRICS_DIMENSIONS"])
	// prod has the default single endpoint.
	arns := asJSON(t, environment(prod.appFunctions(t)["webhook"])["SIGNING_SECRET_ARNS"])
	require.Contains(t, arns, `"billing="`)
	require.NotContains(t, arns, "connect")
}

func TestNATIsOffByDefault(t *testing.T) {
	t.Parallel()
	require.Empty(t, dev.resources("AWS::EC2::NatGateway"))
	require.Empty(t, dev.resources("AWS::EC2::InternetGateway"))
	require.Empty(t, dev.resources("AWS::EC2::VPCEndpoint"), "AWS APIs over IPv6 (network_test.go)")

	require.Len(t, natDev.resources("AWS::EC2::NatGateway"), 1)
	subnets := natDev.resources("AWS::EC2::Subnet")
	for name, fn := range natDev.appFunctions(t) {
		if name == "reconcile" {
			continue // outside the VPC whatever nat says (reconcile.go)
		}
		for _, ref := range props(fn)["VpcConfig"].(map[string]any)["SubnetIds"].([]any) {
			tags := asJSON(t, props(subnets[ref.(map[string]any)["Ref"].(string)])["Tags"])
			require.Contains(t, tags, `{"Key":"aws-cdk:subnet-type","Value":"Private"}`, name)
		}
	}
	_, db := natDev.one(t, "AWS::RDS::DBSubnetGroup", "DatabaseSubnetGroup")
	for _, ref := range props(db)["SubnetIds"].([]any) {
		tags := asJSON(t, props(subnets[ref.(map[string]any)["Ref"].(string)])["Tags"])
		require.Contains(t, tags, `{"Key":"aws-cdk:subnet-type","Value":"Isolated"}`)
	}
}

// TestNagSuppressionsCarryReasons checks every accepted cdk-nag finding
// names a rule and says why in a sentence, and none is stack-wide.
func TestNagSuppressionsCarryReasons(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod} {
		require.NotContains(t, asJSON(t, s.template["Metadata"]), "cdk_nag", "no stack-wide suppressions")
		seen := map[string]bool{}
		for id, r := range s.template["Resources"].(map[string]any) {
			meta, _ := r.(map[string]any)["Metadata"].(map[string]any)
			nag, _ := meta["cdk_nag"].(map[string]any)
			for _, rule := range asSlice(nag["rules_to_suppress"]) {
				rule := rule.(map[string]any)
				ruleID, reason := rule["id"].(string), rule["reason"].(string)
				require.True(t, strings.HasPrefix(ruleID, "AwsSolutions-"), "%s: %s", id, ruleID)
				require.GreaterOrEqual(t, len(reason), 60, "%s: %s needs a specific reason, got %q", id, ruleID, reason)
				seen[ruleID] = true
			}
		}
		if s.settings.Protected() {
			require.NotContains(t, seen, "AwsSolutions-RDS3", "Multi-AZ must not be waived in prod")
			require.NotContains(t, seen, "AwsSolutions-RDS10", "deletion protection must not be waived in prod")
		}
	}
}
