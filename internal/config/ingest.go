package config

import (
	"net/url"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/ingest"
)

// Ingest is the EventBridge ingest function's configuration.
type Ingest struct {
	Common
	// Sources maps each Stripe partner event source to its endpoint
	// (EVENTBRIDGE_SOURCES; required in AWS).
	Sources ingest.Sources
	// QueueURL is the SQS queue the stage's rules send the events to
	// (INGEST_QUEUE_URL), DeadLetterURL its dead-letter queue
	// (INGEST_DLQ_URL): a refused message goes there with its reason.
	QueueURL      string
	DeadLetterURL string
	// Drain bounds one invocation's reading of the queue.
	Drain ingest.DrainConfig
	// WakeFunction and WakeTimeout: as the webhook's (WAKE_FUNCTION,
	// WAKE_TIMEOUT), a worker run after a drain that stored receipts.
	WakeFunction string
	WakeTimeout  time.Duration
}

// LoadIngest reads EVENTBRIDGE_SOURCES (required: source=endpoint pairs
// separated by commas, each source aws.partner/stripe.com/ed_...),
// INGEST_QUEUE_URL and INGEST_DLQ_URL (required), INGEST_BATCH (1 to 10,
// default 10: messages per ReceiveMessage), DEADLINE_MARGIN (default 5s:
// stop receiving this long before the function's timeout), and the
// database settings.
func LoadIngest(env Env) (Ingest, error) {
	var p problems
	c := Ingest{Common: p.common(env, "ingest", 2)}
	raw := strings.TrimSpace(env("EVENTBRIDGE_SOURCES"))
	if raw == "" {
		p.addf("EVENTBRIDGE_SOURCES is not set: name each Stripe event source and its endpoint, e.g. EVENTBRIDGE_SOURCES=aws.partner/stripe.com/ed_61Rxxx=billing (the stack sets it from its eventBridgeSources setting)")
	} else {
		c.Sources.Exact = p.eventBridgeSources(raw)
	}
	c.QueueURL = p.queueURL(env, "INGEST_QUEUE_URL")
	c.DeadLetterURL = p.queueURL(env, "INGEST_DLQ_URL")
	c.Drain.Batch = int32(p.intIn(env, "INGEST_BATCH", 10, 1, 10))
	c.Drain.DeadlineMargin = p.durationIn(env, "DEADLINE_MARGIN", 5*time.Second, time.Second, time.Minute)
	c.WakeFunction, c.WakeTimeout = p.wake(env)
	return c, p.err()
}

func (p *problems) queueURL(env Env, name string) string {
	v := strings.TrimSpace(env(name))
	u, err := url.Parse(v)
	if v == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		p.addf("%s=%q: must be an SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME; the stack sets it)", name, v)
	}
	return v
}

// eventBridgeSources parses SOURCE=ENDPOINT pairs.
func (p *problems) eventBridgeSources(raw string) map[string]string {
	out := map[string]string{}
	for _, pair := range strings.Split(raw, ",") {
		src, ep, ok := strings.Cut(strings.TrimSpace(pair), "=")
		src, ep = strings.TrimSpace(src), strings.TrimSpace(ep)
		switch {
		case !ok || !EndpointName.MatchString(ep):
			p.addf("EVENTBRIDGE_SOURCES: %q must be source=endpoint, with an endpoint name of lower-case letters, digits, - and _", pair)
		case !strings.HasPrefix(src, ingest.PartnerPrefix) || len(src) == len(ingest.PartnerPrefix) || strings.ContainsAny(src, " *"):
			p.addf("EVENTBRIDGE_SOURCES: %q is not a Stripe partner event source: Stripe names it %sed_... (Workbench, the event destination, or GET /v2/core/event_destinations: amazon_eventbridge.aws_event_source_arn)", src, ingest.PartnerPrefix)
		case out[src] != "":
			p.addf("EVENTBRIDGE_SOURCES: source %q is listed twice", src)
		default:
			out[src] = ep
		}
	}
	return out
}

// localEventBridge reads the local runner's EventBridge route
// (POST /_eventbridge): by default any source beginning with
// aws.partner/stripe.com/ belongs to WEBHOOK_ENDPOINT (default billing);
// EVENTBRIDGE_SOURCES, when set, replaces that with its exact pairs.
func (p *problems) localEventBridge(env Env) ingest.Sources {
	if raw := strings.TrimSpace(env("EVENTBRIDGE_SOURCES")); raw != "" {
		return ingest.Sources{Exact: p.eventBridgeSources(raw)}
	}
	ep := strings.TrimSpace(env("WEBHOOK_ENDPOINT"))
	if ep == "" {
		ep = "billing"
	}
	return ingest.Sources{Default: ep}
}
