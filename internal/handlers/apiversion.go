package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
)

// Events carry the API version Stripe rendered them with: a webhook
// delivery the endpoint's version, an event listed on the Events API the
// version it was created with (stripe-go v82, event.go: "Each event data is
// rendered according to Stripe API version at its creation time"), which
// can differ from the endpoint's. The handlers read the fields they need in
// every shape these versions give them:
//
//   - invoices: the payment as invoice.charge before 2025-03-31.basil, as
//     invoice.payments (and invoice_payment.paid) from basil on;
//   - charges: charge.invoice before basil (absent from basil on), the
//     refunds list before 2022-11-15 (absent after unless expanded; the
//     refund.* events carry each refund);
//   - refunds: the same fields in every version.
//
// Stripe changes shapes only in a new major release (the name after the
// date: acacia from 2024-09-30, basil from 2025-03-31); its monthly releases
// within a major add fields without breaking any
// (https://docs.stripe.com/upgrades). So the handlers understand the dated
// versions before the named releases and the releases in
// UnderstoodReleases, and refuse any other: an event of a release they were
// not reviewed for fails with ErrUnknownAPIVersion (the receipt's
// last_error says which version) instead of being booked from fields that
// may have moved. Supporting a new release means reading its changelog for
// the fields above, adding it here, and retrying the receipts (README).

// UnderstoodReleases are the named major releases whose shapes the handlers
// read.
var UnderstoodReleases = []string{"acacia", "basil"}

// ErrUnknownAPIVersion means the event was rendered with an API version whose
// shapes the handlers do not know. Nothing was booked.
var ErrUnknownAPIVersion = errors.New("event rendered with an API version the handlers do not understand")

var apiVersionPattern = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2})(?:\.([a-z]+))?$`)

// checkAPIVersion accepts an event without api_version (the endpoint's own
// version, as older fixtures and some tools send), a dated version without
// a release name, and a version of an understood release.
func checkAPIVersion(payload []byte) error {
	var env struct {
		APIVersion *string `json:"api_version"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	if env.APIVersion == nil || *env.APIVersion == "" {
		return nil
	}
	v := *env.APIVersion
	m := apiVersionPattern.FindStringSubmatch(v)
	switch {
	case m == nil:
		return fmt.Errorf("%w: api_version %q is not a Stripe API version (YYYY-MM-DD or YYYY-MM-DD.release)", ErrUnknownAPIVersion, v)
	case m[2] == "" && m[1] >= "2024-09-30":
		return fmt.Errorf("%w: api_version %q has no release name, which Stripe's versions from 2024-09-30 have", ErrUnknownAPIVersion, v)
	case m[2] != "" && !slices.Contains(UnderstoodReleases, m[2]):
		return fmt.Errorf("%w: api_version %q (release %q); the handlers read the shapes of dated versions and of %v: review the release's changes to invoices, charges and refunds, add it to handlers.UnderstoodReleases, deploy, then retry the receipt",
			ErrUnknownAPIVersion, v, m[2], UnderstoodReleases)
	}
	return nil
}
