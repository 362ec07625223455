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
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
	ObjectID   string // data.object.id, else empty
	Payload    []byte // the exact bytes that were signed
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
			return parse(body)
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
