package approle

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPasswordFromSecret(t *testing.T) {
	t.Parallel()

	pw, err := PasswordFromSecret(`{"username":"inbox_webhook","password":"`+password1+`","engine":"postgres"}`, "inbox_webhook")
	require.NoError(t, err)
	require.Equal(t, password1, pw)

	for _, tc := range []struct{ name, text, want string }{
		{"not JSON", "whsec_x", "not JSON"},
		{"other user", `{"username":"inbox_owner","password":"` + password1 + `"}`, `for user "inbox_owner"`},
		{"no password", `{"username":"inbox_webhook"}`, "16 to 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := PasswordFromSecret(tc.text, "inbox_webhook")
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), password1)
		})
	}
}
