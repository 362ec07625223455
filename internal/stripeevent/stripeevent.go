// Package stripeevent verifies a Stripe webhook delivery and extracts the
// fields the inbox stores. It is the only boundary that decides whether a
// request's contents can be trusted: nothing it rejects may reach the
// database.
//
// The signature is checked with stripe-go's webhook package on the exact bytes
// received, before any JSON parsing, against each of the endpoint's signing
// secrets in turn (during a secret roll Stripe signs with both the old and the
// new secret, and the old one stays valid for up to 24 hours). The event is
// deliberately not decoded into stripe-go's typed Event: an endpoint may be
// pinned to a different API version than stripe-go, and the inbox keeps the
// raw payload instead, together with its api_version.
package stripeevent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
)

// Tolerance is how old a signature's timestamp may be. It is stripe-go's
// default and Stripe's recommendation; it is not configurable because zero
// (no check) would allow replays.
const Tolerance = 5 * time.Minute

// MaxIDLength bounds the event id and type accepted; Stripe's are far shorter.
const MaxIDLength = 255

// Sentinel errors, matched with errors.Is. Each maps to one fixed HTTP answer.
var (
	ErrNotSigned    = errors.New("no Stripe-Signature header")
	ErrBadSignature = errors.New("no valid signature for this endpoint's secrets")
	ErrTooOld       = errors.New("signature timestamp outside the tolerance")
	ErrMalformed    = errors.New("signed body is not a Stripe event")
	ErrNoSecrets    = errors.New("no signing secret configured")
)

// Event is a delivery whose signature has been verified.
type Event struct {
	ID         string
	Type       string
	APIVersion string // empty when the event has none
	Livemode   bool
	Account    string // connected account for Connect events, else empty
	ObjectID   string // data.object.id; of a thin event, related_object.id; else empty
	Payload    []byte // the exact bytes that were signed
	// SecretFingerprint is Fingerprint of the signing secret that verified
	// the delivery (never the secret itself).
	SecretFingerprint string
	// SignedAt is the signature's timestamp (t= of Stripe-Signature).
	SignedAt time.Time
}

// Fingerprint identifies a signing secret without revealing it: the first 8
// bytes of its SHA-256, in hex. Operators compare it with the fingerprint of
// a secret they hold (inboxctl secrets) to know which secret of a roll still
// matches deliveries.
func Fingerprint(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:8])
}

// signedAt reads t= from a Stripe-Signature header that has been verified
// (stripe-go's webhook.ValidatePayloadWithTolerance does not return it).
func signedAt(header string) time.Time {
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && k == "t" {
			if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
				return time.Unix(sec, 0).UTC()
			}
		}
	}
	return time.Time{}
}

// Verify checks header against body with each secret and, when one matches,
// parses the event. It never returns an Event with a nil error unless the
// signature matched.
func Verify(body []byte, header string, secrets []string) (Event, error) {
	if len(secrets) == 0 {
		return Event{}, ErrNoSecrets
	}
	if header == "" {
		return Event{}, ErrNotSigned
	}
	var err error
	for _, secret := range secrets {
		err = webhook.ValidatePayloadWithTolerance(body, header, secret, Tolerance)
		if err == nil {
			ev, err := parse(body)
			if err != nil {
				return Event{}, err
			}
			ev.SecretFingerprint, ev.SignedAt = Fingerprint(secret), signedAt(header)
			return ev, nil
		}
		if !errors.Is(err, webhook.ErrNoValidSignature) {
			// A malformed header or an old timestamp fails the same way
			// whichever secret is tried.
			break
		}
	}
	switch {
	case errors.Is(err, webhook.ErrTooOld):
		return Event{}, ErrTooOld
	case errors.Is(err, webhook.ErrNotSigned):
		return Event{}, ErrNotSigned
	default:
		return Event{}, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
}

// wire is the subset of a Stripe event the inbox reads. Unknown fields are
// ignored: the payload is stored whole.
type wire struct {
	ID         *string `json:"id"`
	Type       *string `json:"type"`
	APIVersion *string `json:"api_version"`
	Livemode   bool    `json:"livemode"`
	Account    *string `json:"account"`
	Data       *struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
	// RelatedObject is a thin event's (object "v2.core.event"): it carries
	// no data, only the object it is about (stripe-go's ThinEvent;
	// https://docs.stripe.com/api/v2/events).
	RelatedObject *struct {
		ID string `json:"id"`
	} `json:"related_object"`
}

// Parse reads the fields the inbox stores from an event whose origin was
// checked another way than by a signature: an event the reconciler listed on
// Stripe's Events API with its own API key over TLS. Payload is body itself.
func Parse(body []byte) (Event, error) { return parse(body) }

func parse(body []byte) (Event, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return Event{}, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}
	var w wire
	if err := json.Unmarshal(trimmed, &w); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if w.ID == nil || !isToken(*w.ID) {
		return Event{}, fmt.Errorf("%w: missing or invalid id", ErrMalformed)
	}
	if w.Type == nil || !isToken(*w.Type) {
		return Event{}, fmt.Errorf("%w: missing or invalid type", ErrMalformed)
	}
	// Text that PostgreSQL's jsonb refuses (an escaped U+0000, a lone
	// surrogate) is valid JSON and not refused here: a verified event must
	// never be refused for its content. internal/inbox stores it losslessly.
	ev := Event{ID: *w.ID, Type: *w.Type, Livemode: w.Livemode, Payload: body}
	if w.APIVersion != nil {
		ev.APIVersion = *w.APIVersion
	}
	if w.Account != nil {
		ev.Account = *w.Account
	}
	if w.Data != nil && len(w.Data.Object) > 0 && w.Data.Object[0] == '{' {
		var obj struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(w.Data.Object, &obj) == nil {
			ev.ObjectID = obj.ID
		}
	}
	if ev.ObjectID == "" && w.RelatedObject != nil {
		ev.ObjectID = w.RelatedObject.ID
	}
	return ev, nil
}

// isToken accepts the shape of Stripe ids and type names: 1 to MaxIDLength
// printable ASCII characters without spaces.
func isToken(s string) bool {
	if s == "" || len(s) > MaxIDLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// DefaultAPIVersion is the API version of the pinned stripe-go, the default
// a stage declares its handlers are written for (infra/stack setting
// stripeApiVersion) until it names its endpoints' version.
const DefaultAPIVersion = stripe.APIVersion

// apiVersion is the shape of a Stripe API version: a date, and since
// 2024-09-30 a release name (2025-03-31.basil).
var apiVersion = regexp.MustCompile(`^20[0-9]{2}-[01][0-9]-[0-3][0-9](\.[a-z]+)?$`)

// CheckAPIVersion reports whether v looks like a Stripe API version, with
// what to set instead.
func CheckAPIVersion(v string) error {
	if !apiVersion.MatchString(v) {
		return fmt.Errorf("%q is not a Stripe API version: use the version of your webhook endpoints as the Stripe dashboard shows it (Developers, Webhooks, the endpoint), e.g. 2025-03-31.basil", v)
	}
	return nil
}
