package stripetest_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// The embedded fixtures are stripe-mock's, of the version
// scripts/lib/stripemock.sh pins: the module is fetched from the Go module
// proxy (or the module cache) and its fixtures3.json compared.
func TestFixturesAreStripeMocks(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile(filepath.Join("..", "..", "scripts", "lib", "stripemock.sh"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^STRIPEMOCK_VERSION=(\S+)$`).FindSubmatch(script)
	require.NotNil(t, m, "STRIPEMOCK_VERSION in scripts/lib/stripemock.sh")
	version := string(m[1])

	cmd := exec.Command("go", "mod", "download", "-json", "github.com/stripe/stripe-mock@"+version)
	cmd.Dir = t.TempDir() // outside this module: its go.mod and go.sum stay as they are
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=on")
	out, err := cmd.Output()
	require.NoError(t, err, "downloading stripe-mock %s (the Go module proxy must be reachable): %s", version, out)
	var mod struct{ Dir string }
	require.NoError(t, json.Unmarshal(out, &mod))

	var upstream struct {
		Resources map[string]any `json:"resources"`
	}
	raw, err := os.ReadFile(filepath.Join(mod.Dir, "embedded", "openapi", "fixtures3.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &upstream))
	var spec struct {
		Info struct {
			Version string `json:"version"`
		} `json:"info"`
	}
	raw, err = os.ReadFile(filepath.Join(mod.Dir, "embedded", "openapi", "spec3.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &spec))
	require.Equal(t, spec.Info.Version, stripetest.FixtureAPIVersion())
	require.True(t, strings.HasSuffix(stripetest.FixtureAPIVersion(), ".dahlia"), stripetest.FixtureAPIVersion())

	for _, object := range []string{"invoice", "invoice_payment", "charge", "refund", "dispute", "balance_transaction"} {
		require.Equal(t, upstream.Resources[object], any(stripetest.Fixture(object)), object)
	}
	// A copy: changing one does not change the next.
	stripetest.Fixture("invoice")["id"] = "in_changed"
	require.NotEqual(t, "in_changed", stripetest.Fixture("invoice")["id"])
}
