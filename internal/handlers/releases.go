package handlers

import (
	"errors"
	"fmt"
	"regexp"
)

// Stripe renders every event in an API version: a webhook delivery in the
// endpoint's version, an event listed on the Events API in the version the
// account had when the event was created (stripe-go v82, event.go: "Each
// event data is rendered according to Stripe API version at its creation
// time"), which can differ from the endpoint's. A new account's default is
// the latest release (clover or dahlia today). Since 2024-09-30 a version is
// YYYY-MM-DD.<release>: the release's first version may break shapes, its
// monthly versions only add ("Each major release ... includes changes that
// aren't backward-compatible with previous releases ... Each monthly release
// includes only backward-compatible changes, and uses the same name as the
// last major release", https://docs.stripe.com/api/versioning).
//
// The handlers are not written per version. Each reads its fields through a
// contract (contract.go) that accepts every shape the versions below give
// them:
//
//   - invoices: the payment as invoice.charge (with invoice.payment_intent
//     and invoice.paid) up to acacia, as invoice.payments (when the payload
//     includes it) and the invoice_payment.paid event from basil on;
//   - invoice payments (basil and later): payment.type charge or
//     payment_intent name a Stripe payment; payment_record (2025-10-29.clover
//     and later) is money paid outside Stripe: it links nothing;
//   - charges: charge.invoice up to acacia (absent from basil on), the
//     refunds list only when expanded since 2022-11-15 (the refund.* events
//     carry each refund);
//   - refunds: the same fields in every version;
//   - disputes: the same fields in every version (id, amount, currency,
//     charge, payment_intent, status, balance_transactions); the status
//     prevented since 2025-08-27.basil;
//   - payments outside Stripe: invoice.paid_out_of_band up to acacia
//     (removed in basil, whose amount_paid counts them), the payment_record
//     invoice payments from 2025-10-29.clover on, and
//     invoice.amount_paid_off_stripe from 2026-05-27.dahlia on when the
//     payload includes it.
//
// An event of any version whose fields satisfy the contract is booked. An
// event of a release not in Releases is booked too when its shape holds
// (Options.UnnamedReleases can hold it for review instead), and the worker
// counts it (metric UnexpectedApiVersion, alarm ApiVersionDrift), so that a
// human reads the new release's changelog and names it here. What to do
// when Stripe ships a release: docs/operations.md, "A new Stripe API
// release".

// Release is a named Stripe API release whose changelog entries were read
// for every field the handlers read.
type Release struct {
	// Name is the release's name (the suffix of its versions).
	Name string
	// First is its first version's date, the one that may break shapes.
	First string
	// Read are the changelog entries read for it, and what they change
	// for the handlers.
	Read []string
}

// Releases are the named releases, oldest first. Versions before the first
// (dated, YYYY-MM-DD) are understood as well: their shapes are the ones
// acacia kept (stripe-go CHANGELOG.md 80.0.0: acacia's breaking changes are
// in billing alerts and terminal readers only).
//
// The entries were read in stripe-go's CHANGELOG.md (the module cache's
// v82.5.1, and github.com/stripe/stripe-go's at 86.2.0 for later releases)
// and in Stripe's changelog pages under https://docs.stripe.com/changelog
// (stored copies reached through a search tool; the release overview pages
// were read in their summaries).
var Releases = []Release{
	{Name: "acacia", First: "2024-09-30", Read: []string{
		"stripe-go 80.0.0 (2024-09-30.acacia): breaking changes in BillingAlert (usage_threshold, filter) and TerminalReader only; nothing on Invoice, Charge, Refund or Dispute",
		"stripe-go 72.83.0 (2022-01-13): adds Invoice.PaidOutOfBand, read up to acacia; stripe-go 75.0.0 removed the Dispute status charge_refunded, which no version the handlers know sends",
		"stripe-go 81.0.0 to 81.4.0 (2024-10-28 to 2025-02-24.acacia): no change to the fields read (81.0.0 makes Refund.next_action.display_details non-nullable, which is not read)",
		"https://docs.stripe.com/changelog/acacia (cited by stripe-go 80.0.0): not reached through the search tool; the stripe-go entries were relied on",
	}},
	{Name: "basil", First: "2025-03-31", Read: []string{
		"https://docs.stripe.com/changelog/basil/2025-03-31/add-support-for-multiple-partial-payments-on-invoices: removes payment_intent, charge, paid and paid_out_of_band from Invoice and invoice from Charge and PaymentIntent; amount_paid now reflects out-of-band payments",
		"stripe-go 82.0.0 (2025-03-31.basil): removes Charge, PaymentIntent, Paid, PaidOutOfBand on Invoice and Invoice on Charge; adds InvoicePayment, Invoice.Payments, Invoice.AmountOverpaid",
		"https://docs.stripe.com/changelog/basil/2025-05-28/partial-payments: several payments per invoice; adds the invoice_payment.paid event",
		"stripe-go 82.1.0 to 82.5.1 (to 2025-08-27.basil): no change to the fields read, but 82.5.1 adds the Dispute status prevented (\"supported in the 2025-08-27.basil of the API\")",
		"stripe-go v82.5.1 dispute.go: Dispute.Amount, BalanceTransactions (\"zero, one, or two balance transactions that show funds withdrawn and reinstated\"), Charge, Currency, PaymentIntent, Status; stripe-mock v0.203.0's dispute fixture (2026-08-26.dahlia) has the same fields",
	}},
	{Name: "clover", First: "2025-09-30", Read: []string{
		"stripe-go 83.0.0 (2025-09-30.clover): breaking changes in AccountSession components, Discount.Coupon, payout schedules, subscription schedule iterations and PaymentMethod params; nothing on Invoice, InvoicePayment, Charge, Refund or Dispute (adds the value prevented on Dispute.Status)",
		"https://docs.stripe.com/changelog/clover: 2025-09-30.clover introduces the breaking changes, later clover versions only additive ones",
		"stripe-go 83.1.0 and 83.1.1 (2025-10-29.clover): adds PaymentRecord and InvoicePaymentPayment.PaymentRecord, and the value payment_record of InvoicePaymentPayment.Type",
		"https://docs.stripe.com/changelog/clover/2025-10-29/invoicing-payment-records and .../payment-records: payments processed outside Stripe attached to invoices as Payment Records",
		"stripe-go 84.0.0 to 84.4.1 (to 2026-02-25.clover): no change to the fields read (adds Invoice.CustomerAccount in 2025-12-15.clover)",
	}},
	{Name: "dahlia", First: "2026-03-25", Read: []string{
		"stripe-go 85.0.0 (2026-03-25.dahlia): API breaking changes in Issuing risk assessments, RadarPaymentEvaluation and V2 event destinations; nothing on Invoice, InvoicePayment, Charge, Refund or Dispute",
		"https://docs.stripe.com/changelog/dahlia: 2026-03-25.dahlia introduces the breaking changes, later dahlia versions only additive ones",
		"stripe-go 85.2.0 (2026-05-27.dahlia): adds Invoice.AmountPaidOffStripe (https://docs.stripe.com/changelog/dahlia/2026-05-27/invoice-object-amount-paid-off-stripe-property: the amount paid outside Stripe; \"isn't available in event payloads\" unless included), read when present",
		"stripe-go 86.1.0, 86.2.0 (2026-06-24, 2026-07-29.dahlia): adds Refund.Customer, CustomerAccount and PaymentMethod; nothing changed on the fields read",
		"https://docs.stripe.com/changelog (2026-08-26.dahlia, the version of stripe-mock v0.203.0's fixtures): additions only",
	}},
}

// VersionClass is what the handlers know of an API version.
type VersionClass int

const (
	// VersionNone: the event has no api_version (the endpoint's own).
	VersionNone VersionClass = iota
	// VersionDated: a version before the named releases (YYYY-MM-DD,
	// before 2024-09-30).
	VersionDated
	// VersionNamed: a version of a release in Releases.
	VersionNamed
	// VersionUnnamed: YYYY-MM-DD.<release> of a release not in Releases.
	VersionUnnamed
	// VersionMalformed: not a Stripe API version.
	VersionMalformed
)

var apiVersionPattern = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2})(?:\.([a-z]+))?$`)

// ClassifyVersion says what the handlers know of v.
func ClassifyVersion(v string) VersionClass {
	if v == "" {
		return VersionNone
	}
	m := apiVersionPattern.FindStringSubmatch(v)
	switch {
	case m == nil:
		return VersionMalformed
	case m[2] == "":
		if m[1] >= Releases[0].First {
			return VersionMalformed // Stripe's versions since 2024-09-30 all have a release name
		}
		return VersionDated
	}
	for _, r := range Releases {
		if r.Name == m[2] {
			if m[1] < r.First {
				return VersionMalformed
			}
			return VersionNamed
		}
	}
	return VersionUnnamed
}

// UnnamedReleases is what the handlers do with an event of a release not in
// Releases.
type UnnamedReleases string

const (
	// BookUnnamed (the default): book it when its fields satisfy the
	// contract, as any other version. The worker counts it as drift.
	BookUnnamed UnnamedReleases = "book"
	// HoldUnnamed: fail it with ErrUnnamedRelease, so that it waits for
	// review until someone has read the release's changelog.
	HoldUnnamed UnnamedReleases = "hold"
)

// Options are the handlers' settings.
type Options struct {
	// UnnamedReleases: BookUnnamed ("" means it) or HoldUnnamed.
	UnnamedReleases UnnamedReleases
	// Writebacks are the write-backs turned on (WRITEBACKS, see
	// writebacks.go); none by default.
	Writebacks []string
}

// Validate reports a setting that is not one of the documented values.
func (o Options) Validate() error {
	switch o.UnnamedReleases {
	case "", BookUnnamed, HoldUnnamed:
		return o.validateWritebacks()
	}
	return fmt.Errorf("STRIPE_UNNAMED_RELEASES=%q: must be %q (book an event of a Stripe release the code has not named when its fields satisfy the handlers' contracts) or %q (hold it for review)",
		o.UnnamedReleases, BookUnnamed, HoldUnnamed)
}

// ErrUnknownAPIVersion means the event's api_version is not a Stripe API
// version. Nothing was booked.
var ErrUnknownAPIVersion = errors.New("event rendered with an API version the handlers do not understand")

// ErrUnnamedRelease means the event is of a release the code has not named
// and the stage holds such events for review (HoldUnnamed). Nothing was
// booked.
var ErrUnnamedRelease = fmt.Errorf("%w: a release the code has not named, held for review", ErrUnknownAPIVersion)

// admit checks the event's version against the handlers' options.
func (o Options) admit(ev Event, version string) error {
	switch ClassifyVersion(version) {
	case VersionMalformed:
		return fmt.Errorf("event %s (%s): %w: api_version %q is not a Stripe API version (YYYY-MM-DD before 2024-09-30, else YYYY-MM-DD.release)",
			ev.ID, ev.Type, ErrUnknownAPIVersion, version)
	case VersionUnnamed:
		if o.UnnamedReleases == HoldUnnamed {
			return fmt.Errorf("event %s (%s): %w: api_version %q; read the release's changelog for the fields the handlers read, name it in handlers.Releases and deploy (or set STRIPE_UNNAMED_RELEASES=book), then retry the receipt",
				ev.ID, ev.Type, ErrUnnamedRelease, version)
		}
	}
	return nil
}
