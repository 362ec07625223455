package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/stripetest"
)

// noDB fails the test on any statement: a payload that breaks its
// handler's contract is refused before the handler touches the database.
type noDB struct{ t *testing.T }

func (d noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	d.t.Fatal("a statement ran for a payload that breaks its contract")
	return pgconn.CommandTag{}, nil
}

func (d noDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	d.t.Fatal("a statement ran for a payload that breaks its contract")
	return nil, nil
}

func (d noDB) QueryRow(context.Context, string, ...any) pgx.Row {
	d.t.Fatal("a statement ran for a payload that breaks its contract")
	return nil
}

// versioned is the event JSON of object with the given api_version.
func versioned(t *testing.T, id, typ, version string, object map[string]any) []byte {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(stripetest.Event(id, typ, object), &m))
	m["api_version"] = version
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// The objects of stripe-mock's shapes the handlers read, with the fields
// that link them set.
func fixtureObjects() map[string]map[string]any {
	inv := stripetest.Fixture("invoice")
	inv["id"], inv["status"], inv["amount_paid"] = "in_1", "paid", 1000
	inv["payments"] = map[string]any{"object": "list", "data": []any{
		map[string]any{"object": "invoice_payment", "invoice": "in_1", "payment": map[string]any{"type": "payment_intent", "payment_intent": "pi_1"}},
	}}
	ip := stripetest.Fixture("invoice_payment")
	ip["invoice"] = "in_1"
	ip["payment"] = map[string]any{"type": "payment_intent", "payment_intent": "pi_1"}
	ch := stripetest.Fixture("charge")
	ch["id"] = "ch_1"
	ch["refunds"] = map[string]any{"object": "list", "data": []any{stripetest.Fixture("refund")}}
	return map[string]map[string]any{
		"invoice.paid": inv, "invoice_payment.paid": ip, "charge.refunded": ch, "refund.updated": stripetest.Fixture("refund"),
	}
}

// TestContractNamesTheField: a field a handler reads that is missing, of
// another JSON type, or of a value the handler does not know fails the
// receipt with a *ContractError (an ErrBadPayload) that names the field,
// the event type and the API version, before any statement runs.
func TestContractNamesTheField(t *testing.T) {
	t.Parallel()
	type edit func(o map[string]any)
	set := func(path string, v any) edit {
		return func(o map[string]any) {
			keys := strings.Split(path, ".")
			cur := o
			for _, k := range keys[:len(keys)-1] {
				switch next := cur[k].(type) {
				case map[string]any:
					cur = next
				case []any:
					cur = next[0].(map[string]any) // "data": the first element
				}
			}
			if v == deleted {
				delete(cur, keys[len(keys)-1])
			} else {
				cur[keys[len(keys)-1]] = v
			}
		}
	}
	cases := []struct {
		typ   string
		edit  edit
		field string
		got   string
	}{
		{"invoice.paid", set("amount_paid", "1000"), "data.object.amount_paid", "is a string"},
		{"invoice.paid", set("amount_paid", 10.5), "data.object.amount_paid", "is a number"},
		{"invoice.paid", set("amount_paid", 1e30), "data.object.amount_paid", "is a number"},
		{"invoice.paid", set("amount_paid", deleted), "data.object.amount_paid", "is missing"},
		{"invoice.paid", set("amount_due", nil), "data.object.amount_due", "is null"},
		{"invoice.paid", set("currency", 840), "data.object.currency", "is a number"},
		{"invoice.paid", set("id", ""), "data.object.id", `is ""`},
		{"invoice.paid", set("customer", map[string]any{"object": "customer"}), "data.object.customer", "is an object without a string id"},
		{"invoice.paid", set("charge", 7), "data.object.charge", "is a number"},
		{"invoice.paid", set("payments", "all"), "data.object.payments", "is a JSON string"},
		{"invoice.paid", set("payments.data.payment.type", "voucher"), "data.object.payments.data[0].payment.type", `is "voucher"`},
		{"invoice.paid", set("payments.data.payment.payment_intent", true), "data.object.payments.data[0].payment.payment_intent", "is a boolean"},
		{"invoice.created", set("customer", deleted), "data.object.customer", "is missing"},
		{"invoice_payment.paid", set("invoice", nil), "data.object.invoice", "is null"},
		{"invoice_payment.paid", set("payment.type", deleted), "data.object.payment.type", "is missing"},
		{"invoice_payment.paid", set("payment.type", "cash"), "data.object.payment.type", `is "cash"`},
		{"invoice_payment.paid", set("payment.charge", 1), "data.object.payment.charge", "is a number"},
		{"charge.refunded", set("currency", nil), "data.object.currency", "is null"},
		{"charge.refunded", set("refunds.data.amount", "100"), "data.object.refunds.data[0].amount", "is a string"},
		{"charge.refunded", set("refunds.data.status", "reversed"), "data.object.refunds.data[0].status", `is "reversed"`},
		{"refund.updated", set("amount", 0), "data.object.amount", "is 0"},
		{"refund.updated", set("amount", "100"), "data.object.amount", "is a string"},
		{"refund.updated", set("status", nil), "data.object.status", "is null"},
		{"refund.updated", set("charge", []any{"ch_1"}), "data.object.charge", "is an array"},
		{"refund.updated", set("payment_intent", map[string]any{"id": 5}), "data.object.payment_intent", "is an object without a string id"},
	}
	for _, tc := range cases {
		t.Run(tc.typ+" "+tc.field+" "+tc.got, func(t *testing.T) {
			t.Parallel()
			base := tc.typ
			if strings.HasPrefix(base, "invoice.") {
				base = "invoice.paid"
			}
			object := fixtureObjects()[base]
			tc.edit(object)
			payload := versioned(t, "evt_bad", tc.typ, "2026-09-30.elm", object)
			_, err := handlers.Default().Apply(context.Background(), noDB{t}, handlers.Event{ID: "evt_bad", Type: tc.typ, Payload: payload, Livemode: true})
			require.ErrorIs(t, err, handlers.ErrContract)
			require.ErrorIs(t, err, handlers.ErrBadPayload)
			var ce *handlers.ContractError
			require.True(t, errors.As(err, &ce), "%v", err)
			require.Equal(t, tc.field, ce.Field)
			require.Equal(t, tc.typ, ce.EventType)
			require.Equal(t, "2026-09-30.elm", ce.APIVersion)
			require.Contains(t, err.Error(), tc.got)
			require.Contains(t, err.Error(), "event evt_bad ("+tc.typ+", api_version 2026-09-30.elm): "+tc.field)
		})
	}

	t.Run("the envelope", func(t *testing.T) {
		t.Parallel()
		for field, v := range map[string]any{"created": "yesterday", "api_version": 20250331} {
			var m map[string]any
			require.NoError(t, json.Unmarshal(stripetest.Event("evt_env", "refund.updated", stripetest.Fixture("refund")), &m))
			m[field] = v
			payload, err := json.Marshal(m)
			require.NoError(t, err)
			_, err = handlers.Default().Apply(context.Background(), noDB{t}, handlers.Event{ID: "evt_env", Type: "refund.updated", Payload: payload})
			var ce *handlers.ContractError
			require.True(t, errors.As(err, &ce), "%s: %v", field, err)
			require.Equal(t, field, ce.Field)
		}
		_, err := handlers.Default().Apply(context.Background(), noDB{t}, handlers.Event{ID: "evt_x", Type: "refund.updated", Payload: []byte(`not json`)})
		require.ErrorIs(t, err, handlers.ErrBadPayload)
	})
}

// deleted marks a field to remove in TestContractNamesTheField.
var deleted = &struct{}{}

func TestClassifyVersion(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]handlers.VersionClass{
		"":                          handlers.VersionNone,
		"2017-08-15":                handlers.VersionDated,
		"2024-06-20":                handlers.VersionDated,
		"2024-09-30.acacia":         handlers.VersionNamed,
		"2025-02-24.acacia":         handlers.VersionNamed,
		"2025-03-31.basil":          handlers.VersionNamed,
		"2025-08-27.basil":          handlers.VersionNamed,
		"2025-09-30.clover":         handlers.VersionNamed,
		"2025-10-29.clover":         handlers.VersionNamed,
		"2026-03-25.dahlia":         handlers.VersionNamed,
		"2026-08-26.dahlia":         handlers.VersionNamed,
		"2026-09-30.elm":            handlers.VersionUnnamed,
		"2027-03-31.fig":            handlers.VersionUnnamed,
		"2025-01-01":                handlers.VersionMalformed, // since 2024-09-30 every version has a release name
		"2024-01-01.basil":          handlers.VersionMalformed, // before basil's first version
		"latest":                    handlers.VersionMalformed,
		"2025-03-31.basil; DROP":    handlers.VersionMalformed,
		"2025-03-31.Basil":          handlers.VersionMalformed,
		"2025-03-31.basil.preview":  handlers.VersionMalformed,
		"2026-03-25.dahlia.preview": handlers.VersionMalformed,
	} {
		require.Equal(t, want, handlers.ClassifyVersion(v), v)
	}
}

// TestUnnamedReleases: an event of a release the code has not named is
// booked when its fields satisfy the contract (the default), or held for
// review (HoldUnnamed) with an error that says what to do; a version that
// is not Stripe's is refused either way.
func TestUnnamedReleases(t *testing.T) {
	t.Parallel()
	object := fixtureObjects()["refund.updated"]
	ev := func(version string) handlers.Event {
		return handlers.Event{ID: "evt_v", Type: "refund.updated", Payload: versioned(t, "evt_v", "refund.updated", version, object)}
	}
	hold := handlers.New(handlers.Options{UnnamedReleases: handlers.HoldUnnamed})
	_, err := hold.Apply(context.Background(), noDB{t}, ev("2026-09-30.elm"))
	require.ErrorIs(t, err, handlers.ErrUnnamedRelease)
	require.ErrorIs(t, err, handlers.ErrUnknownAPIVersion)
	require.ErrorContains(t, err, `"2026-09-30.elm"`)
	require.ErrorContains(t, err, "STRIPE_UNNAMED_RELEASES=book")

	for _, reg := range []handlers.Registry{handlers.Default(), hold} {
		_, err = reg.Apply(context.Background(), noDB{t}, ev("latest"))
		require.ErrorIs(t, err, handlers.ErrUnknownAPIVersion)
		require.NotErrorIs(t, err, handlers.ErrUnnamedRelease)
		require.ErrorContains(t, err, `"latest" is not a Stripe API version`)
	}

	require.NoError(t, handlers.Options{}.Validate())
	require.NoError(t, handlers.Options{UnnamedReleases: handlers.HoldUnnamed}.Validate())
	require.ErrorContains(t, handlers.Options{UnnamedReleases: "maybe"}.Validate(), `STRIPE_UNNAMED_RELEASES="maybe"`)
}

// Every named release lists the changelog entries read for it, and the
// releases are in order.
func TestReleasesCiteTheirChangelogs(t *testing.T) {
	t.Parallel()
	prev := ""
	for _, r := range handlers.Releases {
		require.NotEmpty(t, r.Read, r.Name)
		require.Greater(t, r.First, prev, r.Name)
		prev = r.First
		require.Equal(t, handlers.VersionNamed, handlers.ClassifyVersion(r.First+"."+r.Name))
	}
}
