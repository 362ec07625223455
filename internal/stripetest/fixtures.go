package stripetest

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// The objects stripe-mock serves (scripts/lib/stripemock.sh pins it):
// copies of the invoice, invoice_payment, charge, refund, dispute and
// balance_transaction of its
// fixtures3.json, which Stripe generates from its API (TestFixturesAreStripeMocks
// checks the copy against the pinned module). Tests build their objects on
// these shapes, with every field Stripe sends, not only the ones a handler
// reads.
//
//go:embed testdata/stripemock-fixtures.json
var fixturesJSON []byte

var fixtures struct {
	StripeMockVersion string                    `json:"stripe_mock_version"`
	APIVersion        string                    `json:"api_version"`
	Resources         map[string]map[string]any `json:"resources"`
}

func init() {
	if err := json.Unmarshal(fixturesJSON, &fixtures); err != nil {
		panic(fmt.Sprintf("stripetest: testdata/stripemock-fixtures.json: %v", err))
	}
}

// FixtureAPIVersion is the API version of stripe-mock's specification, the
// version its fixtures are rendered in (2026-08-26.dahlia for v0.203.0).
func FixtureAPIVersion() string { return fixtures.APIVersion }

// Fixture returns a fresh copy of stripe-mock's fixture of an object
// (invoice, invoice_payment, charge or refund), to change freely.
func Fixture(object string) map[string]any {
	o, ok := fixtures.Resources[object]
	if !ok {
		panic(fmt.Sprintf("stripetest: no stripe-mock fixture %q", object))
	}
	return deepCopy(o).(map[string]any)
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}
