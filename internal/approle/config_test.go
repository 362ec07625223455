package approle

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const testSecretARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:app-AbCdEf"

func awsEnv(overrides map[string]string) func(string) string {
	m := map[string]string{
		"DB_PROXY_HOST":     "inbox.proxy-abc.us-east-1.rds.amazonaws.com",
		"DB_PROXY_PORT":     "5432",
		"DB_NAME":           "inbox",
		"DB_USER":           "inbox_owner",
		"AWS_REGION":        "us-east-1",
		"APP_DB_USER":       "inbox_app",
		"APP_DB_SECRET_ARN": testSecretARN,
	}
	for k, v := range overrides {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()

	t.Run("AWS", func(t *testing.T) {
		t.Parallel()
		c, err := LoadConfig(awsEnv(nil))
		require.NoError(t, err)
		require.Equal(t, "inbox_owner", c.Database.User)
		require.Equal(t, 5432, c.Database.ProxyPort)
		require.Equal(t, "inbox_app", c.AppUser)
		require.Equal(t, testSecretARN, c.AppSecretARN)
		require.Equal(t, 4*time.Minute, c.ConnectWait)
	})

	t.Run("Local", func(t *testing.T) {
		t.Parallel()
		c, err := LoadConfig(func(k string) string {
			return map[string]string{
				"DATABASE_URL":    "postgres://postgres@127.0.0.1:5432/inbox?sslmode=disable",
				"APP_DB_USER":     "inbox_app",
				"APP_DB_PASSWORD": password1,
				"CONNECT_WAIT":    "0s",
			}[k]
		})
		require.NoError(t, err)
		require.Equal(t, password1, c.AppPassword)
		require.Zero(t, c.ConnectWait)
	})

	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"nothing set", map[string]string{"DB_PROXY_HOST": "", "APP_DB_USER": "", "APP_DB_SECRET_ARN": ""},
			[]string{"DATABASE_URL", "APP_DB_USER is not set", "APP_DB_SECRET_ARN"}},
		{"owner is the app role", map[string]string{"DB_USER": "inbox_app"}, []string{"schema owner"}},
		{"bad port", map[string]string{"DB_PROXY_PORT": "99999"}, []string{"DB_PROXY_PORT"}},
		{"not an ARN", map[string]string{"APP_DB_SECRET_ARN": "inbox/app"}, []string{"Secrets Manager ARN"}},
		{"both password sources", map[string]string{"APP_DB_PASSWORD": password1}, []string{"not both"}},
		{"bad role", map[string]string{"APP_DB_USER": "Inbox"}, []string{"APP_DB_USER"}},
		{"bad wait", map[string]string{"CONNECT_WAIT": "forever"}, []string{"CONNECT_WAIT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadConfig(awsEnv(tc.env))
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestPasswordFromSecret(t *testing.T) {
	t.Parallel()

	pw, err := PasswordFromSecret(`{"username":"inbox_app","password":"`+password1+`","engine":"postgres"}`, "inbox_app")
	require.NoError(t, err)
	require.Equal(t, password1, pw)

	for _, tc := range []struct{ name, text, want string }{
		{"not JSON", "whsec_x", "not JSON"},
		{"other user", `{"username":"inbox_owner","password":"` + password1 + `"}`, `for user "inbox_owner"`},
		{"no password", `{"username":"inbox_app"}`, "16 to 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := PasswordFromSecret(tc.text, "inbox_app")
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), password1)
		})
	}
}
