// Package config reads each function's settings from the environment and
// validates them, so that a mistake fails the function's start with a message
// naming the variable and what to put in it. All errors are reported at once.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"

	"github.com/stripe-inbox/inbox/internal/database"
)

// Env looks up a variable; os.Getenv in production, a map in tests.
type Env func(string) string

// problems collects configuration errors.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// addErr adds err, each error of an errors.Join on its own line, after
// prefix ("" for none).
func (p *problems) addErr(prefix string, err error) {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			p.addErr(prefix, e)
		}
		return
	}
	if err != nil {
		*p = append(*p, prefix+err.Error())
	}
}

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return errors.New("invalid configuration:\n  - " + strings.Join(p, "\n  - "))
}

// Common holds the settings every function shares.
type Common struct {
	Database          database.Config
	MetricsNamespace  string
	MetricsDimensions map[string]string
	// MetricsPublish (METRICS_PUBLISH): nil publishes every metric;
	// otherwise only these names, with the base dimensions
	// (metrics.Emitter.Publish); "none" publishes nothing. The stack sets
	// it to the metrics its alarms and dashboard read.
	MetricsPublish []string
	LogLevel       slog.Level // LOG_LEVEL
}

// metricsSettings reads METRICS_NAMESPACE and METRICS_DIMENSIONS (also for
// functions without a database, such as the reconciler outside the VPC).
func (p *problems) metricsSettings(env Env, app string) (string, map[string]string) {
	ns := strings.TrimSpace(env("METRICS_NAMESPACE"))
	if ns == "" {
		ns = "StripeInbox"
	}
	dims := map[string]string{"Service": app}
	if raw := strings.TrimSpace(env("METRICS_DIMENSIONS")); raw != "" {
		for _, pair := range strings.Split(raw, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if !ok || k == "" || v == "" {
				p.addf("METRICS_DIMENSIONS=%q: must be Name=value pairs separated by commas, e.g. Stage=prod", raw)
				break
			}
			dims[k] = v
		}
	}
	return ns, dims
}

// metricsPublish reads METRICS_PUBLISH: unset, "none", or metric names
// separated by commas.
func (p *problems) metricsPublish(env Env) []string {
	raw := strings.TrimSpace(env("METRICS_PUBLISH"))
	switch raw {
	case "":
		return nil
	case "none":
		return []string{}
	}
	var names []string
	for _, n := range strings.Split(raw, ",") {
		n = strings.TrimSpace(n)
		if !metricName.MatchString(n) {
			p.addf("METRICS_PUBLISH=%q: must be none or metric names (letters, digits, _) separated by commas", raw)
			return nil
		}
		names = append(names, n)
	}
	return names
}

var metricName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,254}$`)

func (p *problems) common(env Env, app string, defaultConns int) Common {
	c := Common{LogLevel: p.logLevel(env)}
	c.MetricsNamespace, c.MetricsDimensions = p.metricsSettings(env, app)
	c.MetricsPublish = p.metricsPublish(env)
	c.Database = p.database(env, app, defaultConns)
	return c
}

// database reads DATABASE_URL, or the proxy's DB_PROXY_HOST,
// DB_PROXY_PORT, DB_NAME, DB_USER and AWS_REGION, and DB_MAX_CONNS, and
// validates them (database.Config.Validate checks their ranges).
func (p *problems) database(env Env, app string, defaultConns int) database.Config {
	db := database.Config{
		URL:       strings.TrimSpace(env("DATABASE_URL")),
		ProxyHost: strings.TrimSpace(env("DB_PROXY_HOST")),
		Name:      strings.TrimSpace(env("DB_NAME")),
		User:      strings.TrimSpace(env("DB_USER")),
		Region:    strings.TrimSpace(env("AWS_REGION")),
		AppName:   "inbox-" + app,
	}
	db.ProxyPort = p.wholeNumber(env, "DB_PROXY_PORT", 5432)
	db.MaxConns = int32(min(max(p.wholeNumber(env, "DB_MAX_CONNS", defaultConns), math.MinInt32), math.MaxInt32))
	p.addErr("database: ", db.Validate())
	return db
}
