package config

// MapEnv adapts a map to Env, for this package's tests (the other
// packages' tests use configtest.MapEnv).
func MapEnv(m map[string]string) Env { return func(k string) string { return m[k] } }
