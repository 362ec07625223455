// Package database opens the pgx pool every function uses, either from a
// plain URL (local runs, tests) or through RDS Proxy with IAM authentication
// (AWS).
package database

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The pool's connection bounds. MaxConnIdleTime is also the RDS Proxy's idle
// client timeout (infra/stack): a Lambda instance frozen between invocations
// cannot close its idle connections itself, so the proxy does, after the same
// time. MaxConnLifetime bounds a connection's age while the process runs (a
// connection outlives its 15-minute IAM token; this renews it now and then).
const (
	MaxConnLifetime = 30 * time.Minute
	MaxConnIdleTime = 5 * time.Minute
)

// MaxMaxConns bounds MaxConns (DB_MAX_CONNS): more than a function could
// use, and a typo such as 1000 would starve the database.
const MaxMaxConns = 100

// Config says how to reach PostgreSQL. Exactly one of URL and ProxyHost is set.
type Config struct {
	// URL is a libpq-style URL or DSN (DATABASE_URL). Local runs and tests.
	URL string

	// ProxyHost, ProxyPort, Name, User and Region reach the RDS Proxy with
	// an IAM auth token generated for each new connection (tokens live 15
	// minutes; a connection keeps working after its token expires). TLS is
	// required and the proxy's certificate is verified against the system
	// roots (RDS Proxy serves an ACM certificate, publicly trusted).
	ProxyHost string
	ProxyPort int
	Name      string
	User      string
	Region    string

	// MaxConns bounds the pool. A Lambda handles one request at a time, so
	// the webhook needs 1-2; the worker needs one per drainer.
	MaxConns int32
	// AppName is reported in pg_stat_activity (application_name).
	AppName string
	// PreparedStatements turns on pgx's prepared-statement cache. Off for
	// the webhook, whose many short-lived Lambda connections must multiplex
	// through RDS Proxy; on for the worker, which holds its few connections
	// for a whole run anyway (see Open).
	PreparedStatements bool
}

// Validate reports every configuration mistake, phrased as what to fix and
// naming the variable. The ranges of DB_PROXY_PORT and DB_MAX_CONNS are
// checked here only (config only parses them).
func (c Config) Validate() error {
	var errs []error
	switch {
	case c.URL != "" && c.ProxyHost != "":
		errs = append(errs, errors.New("set either DATABASE_URL or DB_PROXY_HOST, not both"))
	case c.URL == "" && c.ProxyHost == "":
		errs = append(errs, errors.New("set DATABASE_URL (local) or DB_PROXY_HOST, DB_NAME, DB_USER and AWS_REGION (RDS Proxy with IAM auth)"))
	case c.ProxyHost != "" && (c.Name == "" || c.User == "" || c.Region == ""):
		errs = append(errs, errors.New("DB_PROXY_HOST needs DB_NAME, DB_USER and AWS_REGION as well"))
	case c.URL != "":
		if _, err := pgxpool.ParseConfig(c.URL); err != nil {
			errs = append(errs, fmt.Errorf("DATABASE_URL cannot be parsed: %w", err))
		}
	}
	if c.ProxyHost != "" && (c.ProxyPort <= 0 || c.ProxyPort > 65535) {
		errs = append(errs, fmt.Errorf("DB_PROXY_PORT=%d: must be a TCP port from 1 to 65535 (default 5432)", c.ProxyPort))
	}
	if c.MaxConns < 1 || c.MaxConns > MaxMaxConns {
		errs = append(errs, fmt.Errorf("DB_MAX_CONNS=%d: the pool needs from 1 to %d connections", c.MaxConns, MaxMaxConns))
	}
	return errors.Join(errs...)
}

// Open builds the pool. It does not connect: the first query does, so a
// database that is briefly unreachable fails requests (which Stripe retries)
// instead of the function's init. creds is needed only for the proxy.
func Open(ctx context.Context, c Config, creds aws.CredentialsProvider) (*pgxpool.Pool, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	dsn, err := c.dsn(creds)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database config: %w", err)
	}
	cfg.MaxConns = c.MaxConns
	cfg.MinConns = 0
	cfg.MaxConnLifetime = MaxConnLifetime
	cfg.MaxConnIdleTime = MaxConnIdleTime
	c.apply(cfg.ConnConfig)
	if c.ProxyHost != "" {
		cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
			return c.iamAuth(ctx, cc, creds)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("creating database pool: %w", err)
	}
	return pool, nil
}

// Connect opens one dedicated connection, the same way Open's pool opens
// each of its connections (URL, or RDS Proxy with an IAM token and TLS
// verified; the same statement-cache setting): for the migrate function,
// which needs a session of its own (SET ROLE, then the migrations).
func Connect(ctx context.Context, c Config, creds aws.CredentialsProvider) (*pgx.Conn, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	dsn, err := c.dsn(creds)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database config: %w", err)
	}
	c.apply(cfg)
	if c.ProxyHost != "" {
		if err := c.iamAuth(ctx, cfg, creds); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting as %s: %w", c.userName(cfg), err)
	}
	return conn, nil
}

// dsn is the connection string: the URL, or the proxy's with TLS verified.
func (c Config) dsn(creds aws.CredentialsProvider) (string, error) {
	if c.ProxyHost == "" {
		return c.URL, nil
	}
	if creds == nil {
		return "", errors.New("RDS Proxy IAM auth needs AWS credentials")
	}
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=verify-full", c.ProxyHost, c.ProxyPort, c.Name, c.User), nil
}

// apply sets what every connection gets: application_name and the
// statement cache.
//
// No prepared-statement cache unless PreparedStatements. pgx's default
// (cache_statement) creates a named prepared statement per query on each
// connection; behind RDS Proxy a named prepared statement pins the client
// connection to one database connection for its lifetime, which defeats the
// proxy's multiplexing and exhausts database connections under Lambda
// concurrency. Exec mode uses the unnamed statement (still one round trip,
// parameters still sent separately from the SQL), which the proxy
// multiplexes. The queries here are short; the cost is one parse each.
//
// The worker opts in to the cache (PreparedStatements): each drainer holds
// one connection for its whole run and sends the same dozen statements
// thousands of times, so parsing and planning them once per connection
// saves database CPU, while a pinned proxy session costs it nothing it was
// not already using. At most DB_MAX_CONNS sessions per warm worker instance
// stay pinned while idle (MaxConnIdleTime).
func (c Config) apply(cc *pgx.ConnConfig) {
	if c.AppName != "" {
		cc.RuntimeParams["application_name"] = c.AppName
	}
	if !c.PreparedStatements {
		cc.DefaultQueryExecMode = pgx.QueryExecModeExec
		cc.StatementCacheCapacity = 0
		cc.DescriptionCacheCapacity = 0
	}
}

// iamAuth puts a fresh IAM auth token (valid 15 minutes; a connection
// outlives it) into cc's password.
func (c Config) iamAuth(ctx context.Context, cc *pgx.ConnConfig, creds aws.CredentialsProvider) error {
	endpoint := net.JoinHostPort(c.ProxyHost, strconv.Itoa(c.ProxyPort))
	token, err := auth.BuildAuthToken(ctx, endpoint, c.Region, c.User, creds)
	if err != nil {
		return fmt.Errorf("building RDS IAM auth token: %w", err)
	}
	cc.Password = token
	return nil
}

func (c Config) userName(cc *pgx.ConnConfig) string {
	if c.User != "" {
		return c.User
	}
	return cc.User
}
