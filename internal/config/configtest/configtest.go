// Package configtest is test support for the packages whose tests load a
// configuration from a map instead of the environment. Production code
// never imports it.
package configtest

import "github.com/stripe-inbox/inbox/internal/config"

// MapEnv adapts a map to config.Env.
func MapEnv(m map[string]string) config.Env { return func(k string) string { return m[k] } }
