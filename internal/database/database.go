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

// Validate reports the first configuration mistake, phrased as what to fix.
func (c Config) Validate() error {
	switch {
	case c.URL != "" && c.ProxyHost != "":
		return errors.New("set either DATABASE_URL or DB_PROXY_HOST, not both")
	case c.URL == "" && c.ProxyHost == "":
		return errors.New("set DATABASE_URL (local) or DB_PROXY_HOST, DB_NAME, DB_USER and AWS_REGION (RDS Proxy with IAM auth)")
	case c.ProxyHost != "" && (c.Name == "" || c.User == "" || c.Region == ""):
		return errors.New("DB_PROXY_HOST needs DB_NAME, DB_USER and AWS_REGION as well")
	case c.ProxyHost != "" && (c.ProxyPort <= 0 || c.ProxyPort > 65535):
		return fmt.Errorf("DB_PROXY_PORT %d is not a TCP port", c.ProxyPort)
	case c.MaxConns < 1:
		return fmt.Errorf("the pool needs at least one connection, got %d", c.MaxConns)
	}
	if c.URL != "" {
		if _, err := pgxpool.ParseConfig(c.URL); err != nil {
			return fmt.Errorf("DATABASE_URL cannot be parsed: %w", err)
		}
	}
	return nil
}

// Open builds the pool. It does not connect: the first query does, so a
// database that is briefly unreachable fails requests (which Stripe retries)
// instead of the function's init. creds is needed only for the proxy.
func Open(ctx context.Context, c Config, creds aws.CredentialsProvider) (*pgxpool.Pool, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	dsn := c.URL
	if c.ProxyHost != "" {
		if creds == nil {
			return nil, errors.New("RDS Proxy IAM auth needs AWS credentials")
		}
		dsn = fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=verify-full", c.ProxyHost, c.ProxyPort, c.Name, c.User)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database config: %w", err)
	}
	cfg.MaxConns = c.MaxConns
	cfg.MinConns = 0
	cfg.MaxConnLifetime = MaxConnLifetime
	cfg.MaxConnIdleTime = MaxConnIdleTime
	if c.AppName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = c.AppName
	}
	// No prepared-statement cache. pgx's default (cache_statement) creates a
	// named prepared statement per query on each connection; behind RDS
	// Proxy a named prepared statement pins the client connection to one
	// database connection for its lifetime, which defeats the proxy's
	// multiplexing and exhausts database connections under Lambda
	// concurrency. Exec mode uses the unnamed statement (still one round
	// trip, parameters still sent separately from the SQL), which the proxy
	// multiplexes. The queries here are short; the cost is one parse each.
	//
	// The worker opts in to the cache (PreparedStatements): each drainer
	// holds one connection for its whole run and sends the same dozen
	// statements thousands of times, so parsing and planning them once per
	// connection saves database CPU, while a pinned proxy session costs it
	// nothing it was not already using. At most DB_MAX_CONNS sessions per
	// warm worker instance stay pinned while idle (MaxConnIdleTime).
	if !c.PreparedStatements {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.ConnConfig.StatementCacheCapacity = 0
		cfg.ConnConfig.DescriptionCacheCapacity = 0
	}

	if c.ProxyHost != "" {
		endpoint := net.JoinHostPort(c.ProxyHost, strconv.Itoa(c.ProxyPort))
		cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
			token, err := auth.BuildAuthToken(ctx, endpoint, c.Region, c.User, creds)
			if err != nil {
				return fmt.Errorf("building RDS IAM auth token: %w", err)
			}
			cc.Password = token
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("creating database pool: %w", err)
	}
	return pool, nil
}
