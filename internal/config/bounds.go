package config

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// How the loaders read values, and where each range is checked: in exactly
// one place.
//
//   - A setting that a package validates (worker.Config, retention.Config,
//     database.Config: the constructors check them too) is only parsed here,
//     with wholeNumber, duration or days. Its range is checked by that
//     package's Validate, which the loader calls and whose message names the
//     variable.
//   - A setting that no package validates (the secrets' TTLs, the local
//     runner's intervals, the migrate function's CONNECT_WAIT) is checked
//     here, with its range written next to its name where the loader reads
//     it: intIn, durationIn. So are the webhook's MAX_BODY_BYTES and
//     STORE_TIMEOUT, whose ranges are the webhook's constants (MinBodyBytes,
//     MinStoreTimeout, ...), which webhook.New checks again.
//
// A value that does not parse is reported with what to put there and the
// default, and the default is used, so that the other settings are still
// checked and every mistake is reported at once.

// wholeNumber parses name as a whole number; def when unset.
func (p *problems) wholeNumber(env Env, name string, def int) int {
	raw := strings.TrimSpace(env(name))
	if raw == "" {
		return def
	}
	v, err := strconv.Atoi(raw)
	if err != nil {
		p.addf("%s=%q: must be a whole number (default %d)", name, raw, def)
		return def
	}
	return v
}

// duration parses name as a Go duration (0 is allowed); def when unset.
func (p *problems) duration(env Env, name string, def time.Duration) time.Duration {
	raw := strings.TrimSpace(env(name))
	if raw == "" {
		return def
	}
	v, err := time.ParseDuration(raw)
	if err != nil {
		p.addf("%s=%q: must be a duration such as 30s or 5m (default %s)", name, raw, def)
		return def
	}
	return v
}

// days parses name as a whole number of days of unit (24h); def days when
// unset.
func (p *problems) days(env Env, name string, def int, unit time.Duration) time.Duration {
	n := p.wholeNumber(env, name, def)
	if n > int(math.MaxInt64/unit) || n < int(math.MinInt64/unit) {
		p.addf("%s=%d: far too many days (default %d)", name, n, def)
		n = def
	}
	return time.Duration(n) * unit
}

// intIn reads a whole number from min to max; def when unset.
func (p *problems) intIn(env Env, name string, def, min, max int) int {
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

// durationIn reads a duration from min to max; def when unset.
func (p *problems) durationIn(env Env, name string, def, min, max time.Duration) time.Duration {
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
