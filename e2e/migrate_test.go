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

const appSecretARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:inbox-app-db-xyz"

// TestMigrate: the migrate binary, invoked as the deploy's CDK trigger does,
// applies every migration to an empty database and creates the application
// role with the password from its Secrets Manager secret; a second deploy
// applies nothing.
func TestMigrate(t *testing.T) {
	t.Parallel()
	setup(t).binary(t, "migrate")
	db := pgtest.Empty(t)
	role := "inbox_app_e2e_" + randomHex(5)
	// Roles are the cluster's, not the database's: drop it when the test
	// ends (before its database is dropped, so DROP OWNED can run there).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ident := pgx.Identifier{role}.Sanitize()
		var exists bool
		if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role).Scan(&exists); err != nil || !exists {
			return
		}
		for _, q := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	secret, _ := json.Marshal(map[string]string{"username": role, "password": "e2e-" + randomHex(12)})
	sm := newSecretStore(t, map[string]string{appSecretARN: string(secret)})
	em := emulate(t, "migrate", map[string]string{
		"DATABASE_URL":                     db.URL,
		"APP_DB_USER":                      role,
		"APP_DB_SECRET_ARN":                appSecretARN,
		"CONNECT_WAIT":                     "10s",
		"METRICS_NAMESPACE":                "StripeInboxE2E",
		"METRICS_DIMENSIONS":               "Stage=e2e",
		"AWS_REGION":                       "us-east-1",
		"AWS_ACCESS_KEY_ID":                fakeAccessKey,
		"AWS_SECRET_ACCESS_KEY":            "e2e-fake-secret-access-key",
		"AWS_ENDPOINT_URL_SECRETS_MANAGER": sm.URL,
	}, 60*time.Second)

	all, err := migrate.All()
	if err != nil {
		t.Fatal(err)
	}
	type summary struct {
		Applied []string `json:"applied"`
		Current string   `json:"current"`
		AppRole struct {
			Role    string `json:"role"`
			Created bool   `json:"created"`
		} `json:"app_role"`
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
	if len(s.Applied) != len(all) || s.Current != all[len(all)-1].Version || s.AppRole.Role != role || !s.AppRole.Created {
		t.Errorf("first deploy: %+v, want %d migrations applied up to %s and role %s created", s, len(all), all[len(all)-1].Version, role)
	}
	if n := db.Count(t, "webhook_inbox", ""); n != 0 {
		t.Errorf("webhook_inbox: %d rows in a fresh schema", n)
	}
	s = deploy()
	if len(s.Applied) != 0 || s.AppRole.Created {
		t.Errorf("second deploy: %+v, want nothing applied and the role kept", s)
	}
	if n := sm.fetches(appSecretARN); n != 2 {
		t.Errorf("GetSecretValue(app secret) called %d times over two deploys, want 2 (read at each run)", n)
	}
	if n := coldStarts(em); n != 1 {
		t.Errorf("%d INIT phases over two invokes, want 1", n)
	}
}
