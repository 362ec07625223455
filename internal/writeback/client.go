package writeback

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	stripe "github.com/stripe/stripe-go/v82"

	"github.com/stripe-inbox/inbox/internal/stripehttp"
)

// Customer is what a customer call answered: its id and metadata, Stripe's
// request id, and whether the answer was a replay of the key's saved result
// (Idempotent-Replayed: true). The rest of the customer (email, name,
// address: personal data) is not kept.
type Customer struct {
	ID        string
	Metadata  map[string]string
	RequestID string
	Replayed  bool
}

// API is the Stripe calls the sender makes; *Client implements it, with
// stripe-go.
type API interface {
	// UpdateCustomerMetadata is POST /v1/customers/{id} with metadata and
	// the Idempotency-Key key.
	UpdateCustomerMetadata(ctx context.Context, id string, metadata map[string]string, key string) (Customer, error)
	// GetCustomer is GET /v1/customers/{id} (the read-back).
	GetCustomer(ctx context.Context, id string) (Customer, error)
}

// CallError is a failed call: the HTTP status (0 when no answer came: a
// timeout, a reset, a refused connection), the Retry-After header of a 429,
// whether the answer was a replay of the key's saved result
// (Idempotent-Replayed: true: Stripe saves the first request's status and
// body, "including 500 errors", https://docs.stripe.com/api/idempotent_requests),
// and the error.
type CallError struct {
	Status     int
	RetryAfter time.Duration
	Replayed   bool
	Err        error
}

func (e *CallError) Error() string {
	if e.Status == 0 {
		return "no answer: " + e.Err.Error()
	}
	return strconv.Itoa(e.Status) + ": " + e.Err.Error()
}

func (e *CallError) Unwrap() error { return e.Err }

// ClientConfig configures a Client.
type ClientConfig struct {
	// Key is a secret or restricted key with Customers: Write
	// (STRIPE_API_KEY).
	Key string
	// BaseURL is the API's base URL (STRIPE_API_BASE); "" is Stripe's.
	BaseURL string
	// HTTPClient carries the requests (default: a 30 s timeout,
	// stripehttp.NewBackend).
	HTTPClient *http.Client
}

// Client calls Stripe with stripe-go's backend: its request building
// (Authorization, Stripe-Version, the form encoding of CustomerParams, the
// Idempotency-Key header from Params.IdempotencyKey), its URL override
// (BackendConfig.URL) and its error decoding (*stripe.Error), with
// stripe-go's own retries off (MaxNetworkRetries 0): the sender retries,
// after recording the attempt, and always with the intent's key.
type Client struct {
	backend stripe.Backend
	key     string
}

// NewClient builds a Client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Key == "" {
		return nil, errors.New("writeback: no Stripe API key (STRIPE_API_KEY)")
	}
	return &Client{backend: stripehttp.NewBackend(cfg.HTTPClient, cfg.BaseURL), key: cfg.Key}, nil
}

// UpdateCustomerMetadata implements API (customer.Client.Update's call,
// stripe-go v82 customer/client.go).
func (c *Client) UpdateCustomerMetadata(ctx context.Context, id string, metadata map[string]string, key string) (Customer, error) {
	actx, info := stripehttp.Track(ctx)
	p := &stripe.CustomerParams{Params: stripe.Params{Context: actx}}
	p.SetIdempotencyKey(key)
	for k, v := range metadata {
		p.AddMetadata(k, v)
	}
	var cu stripe.Customer
	err := c.backend.Call(http.MethodPost, stripe.FormatURLPath("/v1/customers/%s", id), c.key, p, &cu)
	return answer(&cu, err, info)
}

// GetCustomer implements API.
func (c *Client) GetCustomer(ctx context.Context, id string) (Customer, error) {
	actx, info := stripehttp.Track(ctx)
	p := &stripe.CustomerParams{Params: stripe.Params{Context: actx}}
	var cu stripe.Customer
	err := c.backend.Call(http.MethodGet, stripe.FormatURLPath("/v1/customers/%s", id), c.key, p, &cu)
	return answer(&cu, err, info)
}

func answer(cu *stripe.Customer, err error, info *stripehttp.Answer) (Customer, error) {
	if err != nil {
		ce := &CallError{Status: info.Status, Replayed: info.Replayed, Err: err}
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode != 0 {
			ce.Status = se.HTTPStatusCode
		}
		if d, ok := info.RetryAfterDelay(); ok {
			ce.RetryAfter = d
		}
		return Customer{}, ce
	}
	return Customer{ID: cu.ID, Metadata: cu.Metadata, RequestID: info.RequestID, Replayed: info.Replayed}, nil
}
