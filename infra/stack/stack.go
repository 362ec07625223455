// Package stack defines the CloudFormation stack of the Stripe webhook inbox:
// a VPC, RDS PostgreSQL behind RDS Proxy (IAM auth, TLS), the webhook (a
// Function URL), the worker and purge (EventBridge schedules), the migrate
// function that a CDK trigger runs on every deploy before the others are
// updated, and the alarms and dashboard operators use.
package stack

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/triggers"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/stripe-inbox/inbox/internal/database"
)

// Database users and roles (internal/approle keeps them in shape).
//
// MasterUser is the RDS master user. Only the migrate function connects as
// it; it creates the roles and SET ROLEs to SchemaOwnerRole to migrate. Its
// name predates the owner role (it was the schema's owner), and an RDS
// instance's master user name cannot change without replacing the instance.
//
// SchemaOwnerRole (NOLOGIN) owns the schema's objects. WebhookUser,
// WorkerUser and PurgeUser are the functions' logins, each with only its
// function's privileges, its own secret registered with the proxy and its
// own rds-db:connect grant. LegacyAppUser is the role the three functions
// shared before. Until Settings.RetireLegacyAppRole, the migrate function
// keeps it working if it exists (LEGACY_DB_USER), its secret stays
// registered with the proxy, and the three functions may still connect as
// it, so the previous functions keep working while CloudFormation replaces
// them and after a rollback. Once retired, the migrate function strips it
// (RETIRED_DB_USERS) and its secret and grants leave the stack.
const (
	MasterUser      = "inbox_owner"
	SchemaOwnerRole = "inbox_schema_owner"
	WebhookUser     = "inbox_webhook"
	WorkerUser      = "inbox_worker"
	PurgeUser       = "inbox_purge"
	LegacyAppUser   = "inbox_app"
	DatabaseName    = "inbox"
	databasePort    = 5432
)

// functionUsers maps each function that serves traffic or schedules to its
// database user.
var functionUsers = map[string]string{"webhook": WebhookUser, "worker": WorkerUser, "purge": PurgeUser, "ops": OpsUser, "reconcile": ReconcileUser, "ingest": IngestUser, "writeback": WritebackUser}

// SigningSecretPlaceholder is the initial text of each endpoint's signing
// secret. It is deliberately not a whsec_ value, so the webhook refuses to
// start until an operator stores the real one. Never change it: a changed
// value in the template overwrites the secret an operator has filled in.
const SigningSecretPlaceholder = "PLACEHOLDER: store this endpoint's Stripe signing secret here with aws secretsmanager put-secret-value"

// InboxStackProps configure NewInboxStack.
type InboxStackProps struct {
	awscdk.StackProps
	Settings Settings
}

// NewInboxStack defines the stack. It fails when the settings are invalid or
// a function bundle is missing from Settings.AssetsDir.
func NewInboxStack(scope constructs.Construct, id string, props *InboxStackProps) (awscdk.Stack, error) {
	s := props.Settings
	if err := s.CheckAssets(); err != nil {
		return nil, err
	}
	sp := props.StackProps
	if sp.StackName == nil {
		sp.StackName = jsii.String(s.StackName())
	}
	if sp.Description == nil {
		sp.Description = jsii.String(fmt.Sprintf("Stripe webhook transactional inbox (%s)", s.Stage))
	}
	stack := awscdk.NewStack(scope, jsii.String(id), &sp)
	awscdk.Tags_Of(stack).Add(jsii.String("project"), jsii.String("stripe-inbox"), nil)
	awscdk.Tags_Of(stack).Add(jsii.String("stage"), jsii.String(s.Stage), nil)

	b := &builder{stack: stack, s: s, functions: map[string]awslambda.Function{}}
	b.network()
	b.database()
	b.lambdas()
	b.opsFunction()
	b.outboxRelay()
	b.reconcile()
	b.eventBridge()
	b.writeBacks()
	b.security()
	b.migrateOnDeploy()
	b.schedules()
	b.monitoring()
	b.outputs()
	b.suppressNagFindings()
	return stack, nil
}

// builder carries what one part of the stack hands to the next.
type builder struct {
	stack awscdk.Stack
	s     Settings

	vpc         awsec2.Vpc
	appSubnets  *awsec2.SubnetSelection
	dataSubnets *awsec2.SubnetSelection
	// egress is the egress-only gateway and the isolated subnets (with
	// their ::/0 routes): the migrate trigger runs after them.
	egress       []constructs.IConstruct
	flowLogGroup awslogs.LogGroup

	db          awsrds.DatabaseInstance
	dbSG        awsec2.SecurityGroup
	proxy       awsrds.DatabaseProxy
	proxySG     awsec2.SecurityGroup
	userSecrets map[string]awsrds.DatabaseSecret // by function
	signing     map[string]awssecretsmanager.Secret
	apiKey      awssecretsmanager.Secret // the reconciler's Stripe key
	functions   map[string]awslambda.Function
	functionURL awslambda.FunctionUrl
	trigger     triggers.Trigger
	dashboard   string
	topicArn    *string

	// bus is the outbox relay's event bus; nil with outboxRelay=false
	// (relay.go).
	bus awsevents.EventBus

	// ingestDLQ is the EventBridge ingest's dead-letter queue; nil without
	// eventBridgeSources (eventbridge.go).
	ingestDLQ awssqs.Queue

	// legacySecret is LegacyAppUser's secret; nil once it is retired.
	legacySecret awsrds.DatabaseSecret

	// published: by service, the metrics the alarms and the dashboard read
	// (emf); each function publishes those only (publishMetrics).
	published map[string]map[string]bool
}

func (b *builder) removal() awscdk.RemovalPolicy {
	if b.s.Protected() {
		return awscdk.RemovalPolicy_RETAIN
	}
	return awscdk.RemovalPolicy_DESTROY
}

// network is a dual-stack VPC over two AZs. The database, the proxy and the
// functions sit in isolated subnets (no IPv4 route out, no NAT); the
// functions that call AWS APIs leave over IPv6 through an egress-only
// internet gateway, which has no hourly charge and admits no connection
// from outside (https://docs.aws.amazon.com/vpc/latest/userguide/egress-only-internet-gateway.html).
// nat=true adds private subnets behind one NAT gateway for the functions.
//
// CDK's Vpc with IpProtocol DUAL_STACK gives the VPC an Amazon-provided
// /56 (AWS::EC2::VPCCidrBlock) and each subnet a /64 with
// AssignIpv6AddressOnCreation, but adds the ::/0 route to the egress-only
// gateway to PRIVATE_WITH_EGRESS subnets only (aws-ec2/lib/vpc.js in the
// pinned aws-cdk-lib: privateSubnets.forEach(addIpv6DefaultEgressOnlyInternetRoute)),
// and creates the gateway itself only without the feature flag
// @aws-cdk/aws-ec2:requirePrivateSubnetsForEgressOnlyInternetGateway or
// with private subnets. So the isolated subnets get the route here, to
// CDK's gateway (EIGW6) or to one made here when CDK made none.
//
// An existing stage's upgrade keeps its VPC and subnets (same logical ids,
// same IPv4 CIDRs, AZs and VPC): CloudFormation adds the IPv6 block and
// modifies each subnet in place (TestUpgradeModifiesTheSubnets; check the
// change set, docs/deployment.md).
func (b *builder) network() {
	subnets := []*awsec2.SubnetConfiguration{
		{Name: jsii.String("data"), SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED, CidrMask: jsii.Number(24)},
	}
	b.dataSubnets = &awsec2.SubnetSelection{SubnetGroupName: jsii.String("data")}
	b.appSubnets = b.dataSubnets
	nat := 0.0
	if b.s.NAT {
		nat = 1
		subnets = append(subnets,
			// MapPublicIpOnLaunch as before dual-stack (CDK turns it off
			// for dual-stack public subnets): nothing launches there but
			// the NAT gateway, which has its own address.
			&awsec2.SubnetConfiguration{Name: jsii.String("public"), SubnetType: awsec2.SubnetType_PUBLIC, CidrMask: jsii.Number(24), MapPublicIpOnLaunch: jsii.Bool(true)},
			&awsec2.SubnetConfiguration{Name: jsii.String("app"), SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS, CidrMask: jsii.Number(22)},
		)
		b.appSubnets = &awsec2.SubnetSelection{SubnetGroupName: jsii.String("app")}
	}
	b.flowLogGroup = awslogs.NewLogGroup(b.stack, jsii.String("VpcFlowLogs"), &awslogs.LogGroupProps{
		Retention:     retention(b.s.LogRetentionDays),
		RemovalPolicy: b.removal(),
	})
	b.vpc = awsec2.NewVpc(b.stack, jsii.String("Vpc"), &awsec2.VpcProps{
		IpAddresses:         awsec2.IpAddresses_Cidr(jsii.String("10.40.0.0/16")),
		IpProtocol:          awsec2.IpProtocol_DUAL_STACK,
		MaxAzs:              jsii.Number(2),
		NatGateways:         jsii.Number(nat),
		SubnetConfiguration: &subnets,
		FlowLogs: &map[string]*awsec2.FlowLogOptions{
			"Rejected": {
				TrafficType: awsec2.FlowLogTrafficType_REJECT,
				Destination: awsec2.FlowLogDestination_ToCloudWatchLogs(b.flowLogGroup, nil),
			},
		},
	})
	var eigw string
	if c, ok := b.vpc.Node().TryFindChild(jsii.String("EIGW6")).(awsec2.CfnEgressOnlyInternetGateway); ok && c != nil {
		eigw = *c.Ref()
		b.egress = append(b.egress, c)
	} else {
		g := awsec2.NewCfnEgressOnlyInternetGateway(b.vpc, jsii.String("EgressOnlyIgw"), &awsec2.CfnEgressOnlyInternetGatewayProps{
			VpcId: b.vpc.VpcId(),
		})
		eigw = *g.Ref()
		b.egress = append(b.egress, g)
	}
	for _, sn := range *b.vpc.IsolatedSubnets() {
		sn.(awsec2.Subnet).AddIpv6DefaultEgressOnlyInternetRoute(jsii.String(eigw))
		b.egress = append(b.egress, sn)
	}
}

// callAWSOverIPv6 lets fn reach AWS APIs: outbound IPv6 from its dual-stack
// subnets (Lambda's Ipv6AllowedForDualStack, off by default:
// https://docs.aws.amazon.com/lambda/latest/dg/API_VpcConfig.html) and
// HTTPS to ::/0 in its security group. The SDK clients pick the dual-stack
// hosts (internal/dualstack); nothing else leaves: no IPv4 route out
// exists, and the group allows only 443.
func (b *builder) callAWSOverIPv6(name string, fn awslambda.Function) {
	for _, sg := range *fn.Connections().SecurityGroups() {
		sg.AddEgressRule(awsec2.Peer_AnyIpv6(), awsec2.Port_Tcp(jsii.Number(443)),
			jsii.String(name+" function to AWS APIs over IPv6 (egress-only gateway)"), jsii.Bool(false))
	}
}

// wakesTheWorker lets fn start a worker run after receipts commit
// (internal/wake: an asynchronous Invoke of the worker function only), when
// workerWake is on: the webhook after each new receipt, the EventBridge
// ingest after a drain that stored any.
func (b *builder) wakesTheWorker(fn awslambda.Function) {
	if !b.s.WorkerWake {
		return
	}
	worker := b.functions["worker"]
	fn.AddEnvironment(jsii.String("WAKE_FUNCTION"), worker.FunctionName(), nil)
	// Exactly the worker, unqualified (invoked by name): no version or
	// alias wildcard.
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("lambda:InvokeFunction"),
		Resources: &[]*string{worker.FunctionArn()},
	}))
}

// database is RDS PostgreSQL (encrypted, private, TLS forced, backed up) and
// an RDS Proxy in front of it that requires TLS and IAM authentication.
func (b *builder) database() {
	// PostgreSQL 17 (the newest 17.x this CDK release names), not 18, though
	// the code is tested on both 15 and 18 (scripts/test.sh): every
	// connection goes through RDS Proxy, and that RDS Proxy supports RDS for
	// PostgreSQL 18 is unconfirmed here. Check AWS's table of the engine
	// versions RDS Proxy supports ("Supported Regions and DB engines for
	// Amazon RDS Proxy") before moving to 18. A database already created on
	// 18 must stay on it: RDS does not downgrade a major version in place.
	engine := awsrds.DatabaseInstanceEngine_Postgres(&awsrds.PostgresInstanceEngineProps{
		Version: awsrds.PostgresEngineVersion_VER_17_9(),
	})
	params := awsrds.NewParameterGroup(b.stack, jsii.String("DatabaseParameters"), &awsrds.ParameterGroupProps{
		Engine:      engine,
		Description: jsii.String("Stripe inbox: TLS required"),
		Parameters:  &map[string]*string{"rds.force_ssl": jsii.String("1")},
	})
	b.dbSG = awsec2.NewSecurityGroup(b.stack, jsii.String("DatabaseSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              b.vpc,
		Description:      jsii.String("RDS PostgreSQL: reachable only from the proxy"),
		AllowAllOutbound: jsii.Bool(false),
	})
	dbRemoval := awscdk.RemovalPolicy_DESTROY
	backupDays := 7.0
	if b.s.Protected() {
		dbRemoval = awscdk.RemovalPolicy_SNAPSHOT
		backupDays = 14
	}
	b.db = awsrds.NewDatabaseInstance(b.stack, jsii.String("Database"), &awsrds.DatabaseInstanceProps{
		Engine:                  engine,
		InstanceType:            awsec2.NewInstanceType(jsii.String(b.s.DBInstanceType)),
		Vpc:                     b.vpc,
		VpcSubnets:              b.dataSubnets,
		SecurityGroups:          &[]awsec2.ISecurityGroup{b.dbSG},
		Credentials:             awsrds.Credentials_FromGeneratedSecret(jsii.String(MasterUser), &awsrds.CredentialsBaseOptions{}),
		DatabaseName:            jsii.String(DatabaseName),
		Port:                    jsii.Number(databasePort),
		ParameterGroup:          params,
		StorageEncrypted:        jsii.Bool(true),
		StorageType:             awsrds.StorageType_GP3,
		AllocatedStorage:        jsii.Number(float64(b.s.DBStorageGiB)),
		MaxAllocatedStorage:     jsii.Number(float64(5 * b.s.DBStorageGiB)),
		PubliclyAccessible:      jsii.Bool(false),
		MultiAz:                 jsii.Bool(b.s.MultiAZ),
		DeletionProtection:      jsii.Bool(b.s.Protected()),
		RemovalPolicy:           dbRemoval,
		BackupRetention:         awscdk.Duration_Days(jsii.Number(backupDays)),
		CopyTagsToSnapshot:      jsii.Bool(true),
		AutoMinorVersionUpgrade: jsii.Bool(true),
	})

	// The proxy logs in to PostgreSQL with these secrets, one per database
	// user (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-secrets-arns.html);
	// clients log in to the proxy with IAM tokens for the same user names.
	// The migrate function sets each role's password from its secret.
	b.userSecrets = map[string]awsrds.DatabaseSecret{}
	proxySecrets := []awssecretsmanager.ISecret{b.db.Secret()}
	users := []string{"webhook", "worker", "purge", "ops", "reconcile"}
	if len(b.s.EventBridgeSources) > 0 {
		users = append(users, "ingest") // eventbridge.go
	}
	if len(b.s.WriteBacks) > 0 {
		users = append(users, "writeback") // writeback.go
	}
	for _, fn := range users {
		b.userSecrets[fn] = awsrds.NewDatabaseSecret(b.stack, jsii.String(OutputID(fn)+"UserSecret"), &awsrds.DatabaseSecretProps{
			Username: jsii.String(functionUsers[fn]),
		})
		proxySecrets = append(proxySecrets, b.userSecrets[fn])
	}
	if !b.s.RetireLegacyAppRole {
		// The earlier release's secret for the shared role, with the
		// same construct ID and properties, so CloudFormation keeps the
		// same secret (and password) rather than replacing it. The
		// proxy must keep it: the functions being replaced, or rolled
		// back to, log in as this user.
		b.legacySecret = awsrds.NewDatabaseSecret(b.stack, jsii.String("AppUserSecret"), &awsrds.DatabaseSecretProps{
			Username: jsii.String(LegacyAppUser),
		})
		proxySecrets = append(proxySecrets, b.legacySecret)
	}
	b.proxySG = awsec2.NewSecurityGroup(b.stack, jsii.String("ProxySecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:         b.vpc,
		Description: jsii.String("RDS Proxy: reachable only from the functions"),
	})
	b.proxy = awsrds.NewDatabaseProxy(b.stack, jsii.String("Proxy"), &awsrds.DatabaseProxyProps{
		ProxyTarget:           awsrds.ProxyTarget_FromInstance(b.db),
		Vpc:                   b.vpc,
		VpcSubnets:            b.dataSubnets,
		SecurityGroups:        &[]awsec2.ISecurityGroup{b.proxySG},
		Secrets:               &proxySecrets,
		IamAuth:               jsii.Bool(true),
		RequireTLS:            jsii.Bool(true),
		DbProxyName:           jsii.String(ProxyName(b.s.StackName())),
		MaxConnectionsPercent: jsii.Number(90),
		BorrowTimeout:         awscdk.Duration_Seconds(jsii.Number(30)),
		// The proxy closes a client connection idle this long (default
		// 1,800 s, https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-connections.html#rds-proxy-connection-pooling-tuning.idleclienttimeout).
		// A Lambda instance is frozen between invocations, so its pool
		// cannot close its own idle connections (MaxConnIdleTime runs only
		// while the process does), and the worker's connections are pinned
		// to a database session each (prepared statements, see
		// internal/database). With the default, a frozen or abandoned worker
		// instance holds up to DB_MAX_CONNS database sessions for 30
		// minutes. Matching the pool's MaxConnIdleTime makes the proxy
		// enforce the same idle bound the pool applies while running; a warm
		// worker (invoked every minute) keeps its connections, and the pool
		// pings a connection idle for more than a second before reusing it,
		// so one the proxy closed is replaced, not used.
		IdleClientTimeout: awscdk.Duration_Seconds(jsii.Number(database.MaxConnIdleTime.Seconds())),
	})

	b.signing = map[string]awssecretsmanager.Secret{}
	for _, ep := range b.s.Endpoints {
		b.signing[ep] = awssecretsmanager.NewSecret(b.stack, jsii.String("SigningSecret"+OutputID(ep)), &awssecretsmanager.SecretProps{
			Description:       jsii.String(fmt.Sprintf("Stripe signing secret (whsec_...) of endpoint %q; two separated by a comma while rolling", ep)),
			SecretStringValue: awscdk.SecretValue_UnsafePlainText(jsii.String(SigningSecretPlaceholder)),
			RemovalPolicy:     b.removal(),
		})
	}
}

var proxyNameInvalid = regexp.MustCompile(`[^a-z0-9]+`)

// ProxyName derives the RDS Proxy name (unique per account and region) from
// the stack name: letters, digits and single hyphens, at most 63 characters.
func ProxyName(stackName string) string {
	base := strings.Trim(proxyNameInvalid.ReplaceAllString(strings.ToLower(stackName), "-"), "-")
	if len(base) > 57 {
		base = strings.TrimRight(base[:57], "-")
	}
	if base == "" || base[0] < 'a' || base[0] > 'z' {
		base = "inbox-" + base
	}
	return base + "-proxy"
}

type function struct {
	name        string
	description string
	dbUser      string
	timeout     awscdk.Duration
	env         map[string]string
	reserved    *float64
	// callsAWS: the function calls AWS APIs (Secrets Manager, STS,
	// EventBridge, Lambda) and leaves the VPC over IPv6 for them
	// (callAWSOverIPv6).
	callsAWS bool
	// maxEventAge, when set, marks a function EventBridge invokes
	// asynchronously on a schedule: Lambda's own async retries are turned
	// off and an event older than this is dropped (see newFunction).
	maxEventAge awscdk.Duration
}

// lambdas defines the four functions: Go binaries for provided.al2023 on
// arm64, in the VPC, logging JSON to a log group with retention.
func (b *builder) lambdas() {
	arns := make([]string, 0, len(b.s.Endpoints))
	for _, ep := range b.s.Endpoints {
		arns = append(arns, ep+"="+*b.signing[ep].SecretArn())
	}
	fns := []function{
		{
			name:        "webhook",
			description: "Verifies Stripe deliveries and commits them to the inbox",
			dbUser:      WebhookUser,
			timeout:     awscdk.Duration_Seconds(jsii.Number(10)),
			reserved:    jsii.Number(float64(b.s.WebhookReservedConcurrency)),
			callsAWS:    true, // Secrets Manager; Lambda (the wake)
			env: map[string]string{
				"SIGNING_SECRET_ARNS": strings.Join(arns, ","),
				"DB_MAX_CONNS":        "2",
				// NOTIFY pins nothing (only LISTEN does); see
				// Settings.WorkerListen for why it is off by default.
				"NOTIFY": onOff(b.s.WorkerListen),
			},
		},
		{
			name:        "worker",
			description: "Drains the inbox: applies each receipt's business effect once",
			dbUser:      WorkerUser,
			// Resident: each invocation polls until timeout - margin, past
			// the next tick (Settings.WorkerTimeout); the reservation
			// bounds how many overlap.
			timeout:  awscdk.Duration_Seconds(jsii.Number(b.s.WorkerTimeout.Seconds())),
			reserved: jsii.Number(float64(b.s.WorkerReservedConcurrency)),
			callsAWS: b.s.OutboxRelay, // EventBridge PutEvents
			env: map[string]string{
				// Checked against internal/config's validation by
				// TestFunctionEnvironmentsPassConfigValidation.
				"WORKER_CONCURRENCY": "4",
				"MAX_ATTEMPTS":       maxAttempts,
				"LEASE":              "2m",
				"STATEMENT_TIMEOUT":  "2s",
				"DEADLINE_MARGIN":    WorkerDeadlineMargin.String(),
				"POLL_INTERVAL":      b.s.WorkerPollInterval.String(),
				"LISTEN":             onOff(b.s.WorkerListen && b.s.WorkerPollInterval > 0),
				"CLAIM_LIMIT":        "50",
				"BATCH_SIZE":         "50",
				"DB_MAX_CONNS":       "5",
				"STRIPE_MODE":        b.s.StripeMode,
				"STRIPE_API_VERSION": b.s.StripeAPIVersion,
				// An event of a release the code has not named: booked
				// when its shape holds, or held for review.
				"STRIPE_UNNAMED_RELEASES": b.s.UnnamedAPIReleases,
			},
			// The next tick comes in a minute: an older event only overlaps it.
			maxEventAge: awscdk.Duration_Seconds(jsii.Number(WorkerMaxEventAge.Seconds())),
		},
		{
			name:        "purge",
			description: "Deletes processed receipts and published outbox rows past retention",
			dbUser:      PurgeUser,
			timeout:     awscdk.Duration_Minutes(jsii.Number(10)),
			env: map[string]string{
				"RETENTION_DAYS":           fmt.Sprint(b.s.RetentionDays),
				"PURGE_BATCH_SIZE":         "1000",
				"SCRUB_PAYLOAD_AFTER_DAYS": fmt.Sprint(b.s.ScrubPayloadAfterDays),
			},
			maxEventAge: awscdk.Duration_Hours(jsii.Number(1)),
		},
		{
			name:        "migrate",
			description: "Deploy step: keeps the database roles in shape, migrates as the schema owner, grants",
			dbUser:      MasterUser,
			timeout:     awscdk.Duration_Minutes(jsii.Number(10)),
			callsAWS:    true, // Secrets Manager
			env: map[string]string{
				"SCHEMA_OWNER_ROLE":     SchemaOwnerRole,
				"WEBHOOK_DB_USER":       WebhookUser,
				"WORKER_DB_USER":        WorkerUser,
				"PURGE_DB_USER":         PurgeUser,
				"WEBHOOK_DB_SECRET_ARN": *b.userSecrets["webhook"].SecretArn(),
				"WORKER_DB_SECRET_ARN":  *b.userSecrets["worker"].SecretArn(),
				"PURGE_DB_SECRET_ARN":   *b.userSecrets["purge"].SecretArn(),
				"OPS_DB_USER":           OpsUser,
				"OPS_DB_SECRET_ARN":     *b.userSecrets["ops"].SecretArn(),
				// The reconciler's store function (reconcile.go).
				"RECONCILE_DB_USER":       ReconcileUser,
				"RECONCILE_DB_SECRET_ARN": *b.userSecrets["reconcile"].SecretArn(),
			},
		},
	}
	migrateEnv := fns[len(fns)-1].env
	if b.s.RetireLegacyAppRole {
		migrateEnv["RETIRED_DB_USERS"] = LegacyAppUser
	} else {
		migrateEnv["LEGACY_DB_USER"] = LegacyAppUser
		migrateEnv["LEGACY_DB_SECRET_ARN"] = *b.legacySecret.SecretArn()
	}
	for _, f := range fns {
		b.functions[f.name] = b.newFunction(f)
	}
	if b.legacySecret != nil {
		b.legacySecret.GrantRead(b.functions["migrate"], nil)
		// Until retired, each function's role may still connect as the
		// shared user: CloudFormation may update a function's policy
		// before the function itself, and the previous code (which logs
		// in as inbox_app) serves until then, or again after a rollback.
		for _, name := range []string{"webhook", "worker", "purge"} {
			b.proxy.GrantConnect(b.functions[name], jsii.String(LegacyAppUser))
		}
	}
	for _, s := range b.signing {
		s.GrantRead(b.functions["webhook"], nil)
	}
	for _, secret := range b.userSecrets {
		secret.GrantRead(b.functions["migrate"], nil)
	}
	b.wakesTheWorker(b.functions["webhook"])
	if !b.s.FunctionURL {
		// Every endpoint comes through EventBridge (eventbridge.go): no
		// public URL at all.
		return
	}
	b.functionURL = b.functions["webhook"].AddFunctionUrl(&awslambda.FunctionUrlOptions{
		// Stripe cannot sign requests with SigV4; the Stripe-Signature
		// header, verified by the handler, is the authentication.
		AuthType: awslambda.FunctionUrlAuthType_NONE,
	})
}

// onOff is a switch's value in a function's environment.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func (b *builder) newFunction(f function) awslambda.Function {
	id := OutputID(f.name)
	env := map[string]*string{
		"DB_PROXY_HOST":      b.proxy.Endpoint(),
		"DB_PROXY_PORT":      jsii.String(fmt.Sprint(databasePort)),
		"DB_NAME":            jsii.String(DatabaseName),
		"DB_USER":            jsii.String(f.dbUser),
		"METRICS_NAMESPACE":  jsii.String(b.s.MetricsNamespace),
		"METRICS_DIMENSIONS": jsii.String("Stage=" + b.s.Stage),
	}
	keys := make([]string, 0, len(f.env))
	for k := range f.env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env[k] = jsii.String(f.env[k])
	}
	// No egress but RDS Proxy on 5432 and, for a function that calls AWS,
	// HTTPS to ::/0 (callAWSOverIPv6).
	sg := awsec2.NewSecurityGroup(b.stack, jsii.String(id+"SecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              b.vpc,
		Description:      jsii.String(fmt.Sprintf("%s function: egress only to RDS Proxy and the endpoints it calls", f.name)),
		AllowAllOutbound: jsii.Bool(false),
	})
	logs := awslogs.NewLogGroup(b.stack, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		Retention:     retention(b.s.LogRetentionDays),
		RemovalPolicy: b.removal(),
	})
	props := &awslambda.FunctionProps{
		Description:                  jsii.String(f.description),
		Runtime:                      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:                 awslambda.Architecture_ARM_64(),
		Handler:                      jsii.String("bootstrap"),
		Code:                         awslambda.Code_FromAsset(jsii.String(filepath.Join(b.s.AssetsDir, f.name)), nil),
		MemorySize:                   jsii.Number(256),
		Timeout:                      f.timeout,
		ReservedConcurrentExecutions: f.reserved,
		Environment:                  &env,
		Vpc:                          b.vpc,
		VpcSubnets:                   b.appSubnets,
		SecurityGroups:               &[]awsec2.ISecurityGroup{sg},
		Ipv6AllowedForDualStack:      jsii.Bool(f.callsAWS),
		LogGroup:                     logs,
		LoggingFormat:                awslambda.LoggingFormat_JSON,
	}
	if f.maxEventAge != nil {
		// EventBridge invokes a Lambda target asynchronously, and Lambda
		// retries an asynchronous invocation that fails twice by default,
		// keeping the event queued for up to six hours
		// (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-lambda-eventinvokeconfig.html).
		// Those retries would stack on the target's own retry policy
		// (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-retry-policy.html)
		// and re-run a scheduled run long after the next tick. With
		// RetryAttempts 0 and a bounded event age, the EventBridge target's
		// retry policy (schedules()) is the only retry, and a failed run is
		// left to the next tick and the Errors alarm.
		props.RetryAttempts = jsii.Number(0)
		props.MaxEventAge = f.maxEventAge
	}
	fn := awslambda.NewFunction(b.stack, jsii.String(id+"Function"), props)
	if f.callsAWS {
		b.callAWSOverIPv6(f.name, fn)
	}
	b.proxy.Connections().AllowFrom(fn, awsec2.Port_Tcp(jsii.Number(databasePort)), jsii.String(f.name+" function to RDS Proxy"))
	b.proxy.GrantConnect(fn, jsii.String(f.dbUser))
	return fn
}

// migrateOnDeploy runs the migrate function on every deploy in which it
// changed (its code embeds the migrations, so a new migration changes it),
// after the database, proxy and Secrets Manager endpoint exist and before
// the webhook, worker and purge functions are created or updated. A failure
// fails the deploy, and CloudFormation rolls back.
func (b *builder) migrateOnDeploy() {
	before := []constructs.Construct{
		b.functions["webhook"], b.functions["worker"], b.functions["purge"], b.functions["ops"], b.functions["reconcilestore"],
	}
	if fn, ok := b.functions["ingest"]; ok {
		before = append(before, fn)
	}
	if fn, ok := b.functions["writebackstore"]; ok {
		before = append(before, fn)
	}
	b.trigger = triggers.NewTrigger(b.stack, jsii.String("MigrateOnDeploy"), &triggers.TriggerProps{
		Handler:                b.functions["migrate"],
		InvocationType:         triggers.InvocationType_REQUEST_RESPONSE,
		Timeout:                awscdk.Duration_Minutes(jsii.Number(10)),
		ExecuteOnHandlerChange: jsii.Bool(true),
		ExecuteAfter:           b.migrateAfter(),
		ExecuteBefore:          &before,
	})
}

// migrateAfter is what the migrate function needs before it runs: the
// database, the proxy, and its way to Secrets Manager (the egress-only
// gateway and the subnets' routes to it).
func (b *builder) migrateAfter() *[]constructs.Construct {
	after := []constructs.Construct{b.db, b.proxy, b.proxySG}
	for _, c := range b.egress {
		after = append(after, c.(constructs.Construct))
	}
	return &after
}

// schedules run the worker every minute (concurrent runs are safe: claims
// use FOR UPDATE SKIP LOCKED) and the purge daily.
func (b *builder) schedules() {
	awsevents.NewRule(b.stack, jsii.String("WorkerSchedule"), &awsevents.RuleProps{
		Description: jsii.String("Drains the inbox"),
		Schedule:    awsevents.Schedule_Expression(jsii.String(b.s.WorkerSchedule)),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(b.functions["worker"], &awseventstargets.LambdaFunctionProps{
			// The next tick comes in a minute; a retry would only overlap it.
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   awscdk.Duration_Seconds(jsii.Number(WorkerMaxEventAge.Seconds())),
		})},
	})
	awsevents.NewRule(b.stack, jsii.String("PurgeSchedule"), &awsevents.RuleProps{
		Description: jsii.String("Deletes receipts past retention"),
		Schedule:    awsevents.Schedule_Expression(jsii.String(b.s.PurgeSchedule)),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(b.functions["purge"], &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(2),
			MaxEventAge:   awscdk.Duration_Hours(jsii.Number(1)),
		})},
	})
}

func (b *builder) outputs() {
	for _, ep := range b.s.Endpoints {
		id := OutputID(ep)
		// The Function URL ends with '/'; the endpoint name is the path.
		if b.functionURL != nil {
			awscdk.NewCfnOutput(b.stack, jsii.String("WebhookUrl"+id), &awscdk.CfnOutputProps{
				Description: jsii.String(fmt.Sprintf("Register this URL for endpoint %q in the Stripe dashboard", ep)),
				Value:       awscdk.Fn_Join(jsii.String(""), &[]*string{b.functionURL.Url(), jsii.String(ep)}),
			})
		}
		awscdk.NewCfnOutput(b.stack, jsii.String("SigningSecretArn"+id), &awscdk.CfnOutputProps{
			Description: jsii.String(fmt.Sprintf("Put endpoint %q's whsec_ signing secret into this secret", ep)),
			Value:       b.signing[ep].SecretArn(),
		})
		awscdk.NewCfnOutput(b.stack, jsii.String("SigningSecretName"+id), &awscdk.CfnOutputProps{
			Description: jsii.String(fmt.Sprintf("Name of endpoint %q's signing secret", ep)),
			Value:       b.signing[ep].SecretName(),
		})
	}
	awscdk.NewCfnOutput(b.stack, jsii.String("DashboardName"), &awscdk.CfnOutputProps{Value: jsii.String(b.dashboard)})
	awscdk.NewCfnOutput(b.stack, jsii.String("AlarmTopicArn"), &awscdk.CfnOutputProps{Value: b.topicArn})
	awscdk.NewCfnOutput(b.stack, jsii.String("MigrateFunctionName"), &awscdk.CfnOutputProps{
		Description: jsii.String("Invoke to re-run migrations and the app-role step by hand"),
		Value:       b.functions["migrate"].FunctionName(),
	})
	awscdk.NewCfnOutput(b.stack, jsii.String("ProxyEndpoint"), &awscdk.CfnOutputProps{Value: b.proxy.Endpoint()})
	b.opsOutputs()
	b.outboxOutputs()
}

var retentions = map[int]awslogs.RetentionDays{
	1: awslogs.RetentionDays_ONE_DAY, 3: awslogs.RetentionDays_THREE_DAYS, 5: awslogs.RetentionDays_FIVE_DAYS,
	7: awslogs.RetentionDays_ONE_WEEK, 14: awslogs.RetentionDays_TWO_WEEKS, 30: awslogs.RetentionDays_ONE_MONTH,
	60: awslogs.RetentionDays_TWO_MONTHS, 90: awslogs.RetentionDays_THREE_MONTHS, 120: awslogs.RetentionDays_FOUR_MONTHS,
	150: awslogs.RetentionDays_FIVE_MONTHS, 180: awslogs.RetentionDays_SIX_MONTHS, 365: awslogs.RetentionDays_ONE_YEAR,
	400: awslogs.RetentionDays_THIRTEEN_MONTHS, 545: awslogs.RetentionDays_EIGHTEEN_MONTHS, 731: awslogs.RetentionDays_TWO_YEARS,
	1096: awslogs.RetentionDays_THREE_YEARS, 1827: awslogs.RetentionDays_FIVE_YEARS, 2192: awslogs.RetentionDays_SIX_YEARS,
	2557: awslogs.RetentionDays_SEVEN_YEARS, 2922: awslogs.RetentionDays_EIGHT_YEARS, 3288: awslogs.RetentionDays_NINE_YEARS,
	3653: awslogs.RetentionDays_TEN_YEARS,
}

func retention(days int) awslogs.RetentionDays { return retentions[days] }
