//go:build linux

package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stripe-inbox/inbox/internal/migrate"
	"github.com/stripe-inbox/inbox/internal/pgtest"
)

const secretARNPrefix = "arn:aws:secretsmanager:us-east-1:000000000000:secret:inbox-"

// TestMigrate: the migrate binary, invoked as the deploy's CDK trigger does,
// creates the schema owner role and the functions' roles (the ops function's too) with the
// passwords from their Secrets Manager secrets, applies every migration to
// an empty database as the owner, and grants each role its privileges; a
// second deploy applies nothing. As the stack configures it by default, it
// is also told to keep the earlier release's shared role (LEGACY_DB_USER,
// with its secret): a new database has none, and none is created.
func TestMigrate(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "migrate")
	db := pgtest.Empty(t)
	suffix := randomHex(5)
	roles := map[string]string{
		"owner":   "inbox_schema_owner_e2e_" + suffix,
		"webhook": "inbox_webhook_e2e_" + suffix,
		"worker":  "inbox_worker_e2e_" + suffix,
		"purge":   "inbox_purge_e2e_" + suffix,
		"ops":     "inbox_ops_e2e_" + suffix,
		// The reconciler's store function's role, as the stack sets it.
		"reconcile": "inbox_reconcile_e2e_" + suffix,
	}
	// Roles are the cluster's, not the database's: drop them when the test
	// ends (before its database is dropped, so DROP OWNED can run there).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, role := range roles {
			ident := pgx.Identifier{role}.Sanitize()
			var exists bool
			if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role).Scan(&exists); err != nil || !exists {
				continue
			}
			for _, q := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
				if _, err := db.Pool.Exec(ctx, q); err != nil {
					t.Errorf("%s: %v", q, err)
				}
			}
		}
	})
	secrets := map[string]string{}
	env := map[string]string{
		"DATABASE_URL":          db.URL,
		"SCHEMA_OWNER_ROLE":     roles["owner"],
		"CONNECT_WAIT":          "10s",
		"METRICS_NAMESPACE":     "StripeInboxE2E",
		"METRICS_DIMENSIONS":    "Stage=e2e",
		"AWS_REGION":            "us-east-1",
		"AWS_ACCESS_KEY_ID":     fakeAccessKey,
		"AWS_SECRET_ACCESS_KEY": "e2e-fake-secret-access-key",
	}
	legacy := "inbox_app_e2e_" + suffix
	roles["legacy"] = legacy // dropped by the cleanup should it be created
	for _, fn := range []string{"webhook", "worker", "purge", "ops", "legacy", "reconcile"} {
		arn := secretARNPrefix + fn + "-" + suffix
		secret, _ := json.Marshal(map[string]string{"username": roles[fn], "password": "e2e-" + fn + "-" + randomHex(12)})
		secrets[arn] = string(secret)
		prefix := map[string]string{"webhook": "WEBHOOK", "worker": "WORKER", "purge": "PURGE", "ops": "OPS", "legacy": "LEGACY", "reconcile": "RECONCILE"}[fn]
		env[prefix+"_DB_USER"] = roles[fn]
		env[prefix+"_DB_SECRET_ARN"] = arn
	}
	sm := newSecretStore(t, secrets)
	env["AWS_ENDPOINT_URL_SECRETS_MANAGER"] = sm.URL
	em := emulate(t, "migrate", env, 60*time.Second)

	all, err := migrate.All()
	if err != nil {
		t.Fatal(err)
	}
	type summary struct {
		Applied []string `json:"applied"`
		Current string   `json:"current"`
		Roles   struct {
			Owner        string `json:"owner"`
			OwnerCreated bool   `json:"owner_created"`
			Users        []struct {
				Role    string `json:"role"`
				Created bool   `json:"created"`
			} `json:"users"`
			Legacy *struct {
				Role string `json:"role"`
			} `json:"legacy"`
		} `json:"roles"`
	}
	deploy := func() summary {
		t.Helper()
		// A CDK trigger's event carries nothing the function reads.
		resp := invoke(t, em, []byte(`{}`))
		if resp.Status != http.StatusOK {
			t.Fatalf("migrate invoke answered HTTP %d: %s", resp.Status, resp.Body)
		}
		var s summary
		if err := json.Unmarshal(resp.Body, &s); err != nil || s.Current == "" {
			t.Fatalf("migrate answer %s is not its summary (err %v)", resp.Body, err)
		}
		return s
	}

	s := deploy()
	if len(s.Applied) != len(all) || s.Current != all[len(all)-1].Version || s.Roles.Owner != roles["owner"] || !s.Roles.OwnerCreated || len(s.Roles.Users) != 5 {
		t.Errorf("first deploy: %+v, want %d migrations applied up to %s, owner %s and five users created (ops and reconcile too)", s, len(all), all[len(all)-1].Version, roles["owner"])
	}
	for _, u := range s.Roles.Users {
		if !u.Created {
			t.Errorf("first deploy: role %s not created", u.Role)
		}
	}
	if s.Roles.Legacy != nil {
		t.Errorf("first deploy kept a shared role %+v in a database that never had one", s.Roles.Legacy)
	}
	var legacyExists bool
	if err := db.Pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", legacy).Scan(&legacyExists); err != nil || legacyExists {
		t.Errorf("the shared role %s exists (err %v): a new database must never get it", legacy, err)
	}
	var owner string
	if err := db.Pool.QueryRow(context.Background(), "SELECT tableowner FROM pg_tables WHERE tablename = 'webhook_inbox'").Scan(&owner); err != nil || owner != roles["owner"] {
		t.Errorf("webhook_inbox is owned by %q (err %v), want the owner role %s", owner, err, roles["owner"])
	}
	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Errorf("webhook_inbox: %d rows in a fresh schema", n)
	}
	s = deploy()
	if len(s.Applied) != 0 || s.Roles.OwnerCreated {
		t.Errorf("second deploy: %+v, want nothing applied and the roles kept", s)
	}
	for arn := range secrets {
		if n := sm.fetches(arn); n != 2 {
			t.Errorf("GetSecretValue(%s) called %d times over two deploys, want 2 (read at each run)", arn, n)
		}
	}
	if n := coldStarts(em); n != 1 {
		t.Errorf("%d INIT phases over two invokes, want 1", n)
	}
}
