package approle

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe-inbox/inbox/internal/database"
)

// Config is the migrate function's configuration.
type Config struct {
	// Database reaches PostgreSQL as the owner: the user that owns the
	// schema and runs migrations (DB_USER, e.g. inbox_owner).
	Database database.Config
	// AppUser is the application role to keep in shape (APP_DB_USER,
	// e.g. inbox_app).
	AppUser string
	// AppSecretARN is the Secrets Manager secret holding the application
	// role's credentials as JSON {"username": ..., "password": ...}
	// (APP_DB_SECRET_ARN; AWS). RDS Proxy logs in with the same secret.
	AppSecretARN string
	// AppPassword is the application role's password given directly
	// (APP_DB_PASSWORD; local runs only).
	AppPassword string
	// ConnectWait is how long to keep retrying the first connection
	// (CONNECT_WAIT, default 4m): on a stack's first deploy the proxy's
	// target can take minutes to become available.
	ConnectWait time.Duration
}

// LoadConfig reads the migrate function's configuration from env and reports
// every mistake at once.
func LoadConfig(env func(string) string) (Config, error) {
	var problems []string
	addf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	get := func(k string) string { return strings.TrimSpace(env(k)) }

	c := Config{
		Database: database.Config{
			URL:       get("DATABASE_URL"),
			ProxyHost: get("DB_PROXY_HOST"),
			ProxyPort: 5432,
			Name:      get("DB_NAME"),
			User:      get("DB_USER"),
			Region:    get("AWS_REGION"),
			MaxConns:  1,
			AppName:   "inbox-migrate",
		},
		AppUser:      get("APP_DB_USER"),
		AppSecretARN: get("APP_DB_SECRET_ARN"),
		AppPassword:  get("APP_DB_PASSWORD"),
		ConnectWait:  4 * time.Minute,
	}
	if raw := get("DB_PROXY_PORT"); raw != "" {
		port, err := strconv.Atoi(raw)
		if err != nil || port < 1 || port > 65535 {
			addf("DB_PROXY_PORT=%q: must be a TCP port from 1 to 65535 (default 5432)", raw)
		} else {
			c.Database.ProxyPort = port
		}
	}
	if err := c.Database.Validate(); err != nil {
		addf("database: %v", err)
	}
	if c.Database.ProxyHost != "" && c.Database.User == c.AppUser {
		addf("DB_USER=%q: migrations run as the schema owner, not as the application role APP_DB_USER", c.Database.User)
	}
	switch {
	case c.AppUser == "":
		addf("APP_DB_USER is not set: name the application role, e.g. inbox_app")
	default:
		if err := checkRoleName(c.AppUser); err != nil {
			addf("APP_DB_USER: %v", err)
		}
	}
	switch {
	case c.AppSecretARN != "" && c.AppPassword != "":
		addf("set either APP_DB_SECRET_ARN (AWS) or APP_DB_PASSWORD (local), not both")
	case c.AppSecretARN != "":
		if !strings.HasPrefix(c.AppSecretARN, "arn:") || !strings.Contains(c.AppSecretARN, ":secretsmanager:") {
			addf("APP_DB_SECRET_ARN=%q: must be a Secrets Manager ARN", c.AppSecretARN)
		}
	case c.AppPassword != "":
		if err := checkPassword(c.AppPassword); err != nil {
			addf("APP_DB_PASSWORD: %v", err)
		}
	default:
		addf("no application role password: set APP_DB_SECRET_ARN=arn:aws:secretsmanager:... (AWS) or APP_DB_PASSWORD (local)")
	}
	if raw := get("CONNECT_WAIT"); raw != "" {
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 || d > 14*time.Minute {
			addf("CONNECT_WAIT=%q: must be a duration such as 4m, from 0s to 14m (default 4m)", raw)
		} else {
			c.ConnectWait = d
		}
	}
	if len(problems) > 0 {
		return c, errors.New("invalid configuration:\n  - " + strings.Join(problems, "\n  - "))
	}
	return c, nil
}

// PasswordFromSecret extracts the password from a secret in the standard RDS
// DatabaseSecret shape ({"username": ..., "password": ...}) and checks that
// the secret is the one for user.
func PasswordFromSecret(text, user string) (string, error) {
	var s struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := json.Unmarshal([]byte(text), &s); err != nil {
		return "", errors.New("the application role's secret is not JSON with username and password fields")
	}
	if s.Username != user {
		return "", fmt.Errorf("the application role's secret is for user %q, but APP_DB_USER is %q", s.Username, user)
	}
	if err := checkPassword(s.Password); err != nil {
		return "", fmt.Errorf("the application role's secret: %w", err)
	}
	return s.Password, nil
}
