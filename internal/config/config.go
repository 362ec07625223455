// Package config reads each function's settings from the environment and
// validates them, so that a mistake fails the function's start with a message
// naming the variable and what to put in it. All errors are reported at once.
package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/database"
)

// Env looks up a variable; os.Getenv in production, a map in tests.
type Env func(string) string

// MapEnv adapts a map to Env.
func MapEnv(m map[string]string) Env { return func(k string) string { return m[k] } }

// problems collects configuration errors.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return errors.New("invalid configuration:\n  - " + strings.Join(p, "\n  - "))
}

func (p *problems) integer(env Env, name string, def, min, max int) int {
	raw := strings.TrimSpace(env(name))
	if raw == "" {
		return def
	}
	v, err := strconv.Atoi(raw)
	if err != nil || v < min || v > max {
		p.addf("%s=%q: must be a whole number from %d to %d (default %d)", name, raw, min, max, def)
		return def
	}
	return v
}

func (p *problems) duration(env Env, name string, def, min, max time.Duration) time.Duration {
	raw := strings.TrimSpace(env(name))
	if raw == "" {
		return def
	}
	v, err := time.ParseDuration(raw)
	if err != nil || v < min || v > max {
		p.addf("%s=%q: must be a duration such as 30s or 5m, from %s to %s (default %s)", name, raw, min, max, def)
		return def
	}
	return v
}

// onOff reads a switch: on or off (also true/false, 1/0).
func (p *problems) onOff(env Env, name string, def bool) bool {
	raw := strings.ToLower(strings.TrimSpace(env(name)))
	switch raw {
	case "":
		return def
	case "on", "true", "1":
		return true
	case "off", "false", "0":
		return false
	}
	word := map[bool]string{true: "on", false: "off"}
	p.addf("%s=%q: must be on or off (default %s)", name, raw, word[def])
	return def
}

// Common holds the settings every function shares.
type Common struct {
	Database          database.Config
	MetricsNamespace  string
	MetricsDimensions map[string]string
}

// metricsSettings reads METRICS_NAMESPACE and METRICS_DIMENSIONS (also for
// functions without a database).
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

func (p *problems) common(env Env, app string, defaultConns int) Common {
	c := Common{}
	c.MetricsNamespace, c.MetricsDimensions = p.metricsSettings(env, app)
	db := database.Config{
		URL:       strings.TrimSpace(env("DATABASE_URL")),
		ProxyHost: strings.TrimSpace(env("DB_PROXY_HOST")),
		Name:      strings.TrimSpace(env("DB_NAME")),
		User:      strings.TrimSpace(env("DB_USER")),
		Region:    strings.TrimSpace(env("AWS_REGION")),
		AppName:   "inbox-" + app,
	}
	db.ProxyPort = p.integer(env, "DB_PROXY_PORT", 5432, 1, 65535)
	db.MaxConns = int32(p.integer(env, "DB_MAX_CONNS", defaultConns, 1, 100))
	if err := db.Validate(); err != nil {
		p.addf("database: %v", err)
	}
	c.Database = db
	return c
}
