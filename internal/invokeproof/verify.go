package invokeproof

import (
	"context"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// Verifier checks proofs against STS.
type Verifier struct {
	endpoint *url.URL
	client   *http.Client
	admit    Admit
	// Now is the clock the proof's date is checked against.
	Now func() time.Time
}

// DefaultTimeout bounds one GetCallerIdentity call.
const DefaultTimeout = 5 * time.Second

// Endpoint is the STS endpoint cfg resolves (what a Signer with the same
// configuration signs for): https://sts.REGION.amazonaws.com/ by default,
// AWS_ENDPOINT_URL_STS when set (a stand-in), the dual-stack
// https://sts.REGION.api.aws/ with AWS_USE_DUALSTACK_ENDPOINT=true. It
// presigns with placeholder credentials, locally, to let the SDK resolve it.
func Endpoint(ctx context.Context, cfg aws.Config) (*url.URL, error) {
	c := sts.NewFromConfig(cfg, func(o *sts.Options) {
		o.Credentials = credentials.NewStaticCredentialsProvider("AKIDRESOLVEONLY", "resolve-only", "")
	})
	req, err := sts.NewPresignClient(c).PresignGetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return nil, fmt.Errorf("resolving the STS endpoint: %w", err)
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		return nil, fmt.Errorf("resolving the STS endpoint: %w", err)
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/"}, nil
}

// NewVerifier verifies proofs with the STS at endpoint (https, or http on
// a loopback address: a stand-in) and admits the identities admit accepts.
// client nil: one with DefaultTimeout that never follows redirects.
func NewVerifier(endpoint *url.URL, admit Admit, client *http.Client) (*Verifier, error) {
	if endpoint == nil || endpoint.Host == "" {
		return nil, errors.New("invokeproof: no STS endpoint")
	}
	if endpoint.Scheme != "https" && (endpoint.Scheme != "http" || !loopback(endpoint.Hostname())) {
		return nil, fmt.Errorf("invokeproof: the STS endpoint %s must be https (http only on a loopback address)", endpoint)
	}
	if admit == nil {
		return nil, errors.New("invokeproof: no principal to admit")
	}
	if client == nil {
		client = &http.Client{Timeout: DefaultTimeout}
	}
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Verifier{endpoint: endpoint, client: &c, admit: admit, Now: time.Now}, nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Host is the STS host the Verifier calls; proofs must be signed for it.
func (v *Verifier) Host() string { return v.endpoint.Host }

// Open verifies env for audience and returns its payload and the verified
// identity.
func (v *Verifier) Open(ctx context.Context, audience string, env Envelope) ([]byte, Identity, error) {
	id, err := v.Verify(ctx, audience, env.Payload, env.Proof)
	if err != nil {
		return nil, Identity{}, err
	}
	return env.Payload, id, nil
}

// amzDate is SigV4's X-Amz-Date layout.
const amzDate = "20060102T150405Z"

// Verify proves that payload was sent to audience by an admitted principal.
func (v *Verifier) Verify(ctx context.Context, audience string, payload []byte, p *Proof) (Identity, error) {
	if p == nil {
		return Identity{}, ErrNoProof
	}
	if len(payload) == 0 || len(payload) > MaxPayload {
		return Identity{}, fmt.Errorf("%w: a payload of %d bytes", ErrMalformed, len(payload))
	}
	q, err := v.query(p)
	if err != nil {
		return Identity{}, err
	}
	u := *v.endpoint
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Identity{}, fmt.Errorf("building the GetCallerIdentity request: %w", err)
	}
	req.Header.Set(Header, Digest(audience, payload))
	resp, err := v.client.Do(req)
	if err != nil {
		return Identity{}, fmt.Errorf("calling STS (%s) to verify the request's proof: %w", v.endpoint.Host, redact(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Identity{}, fmt.Errorf("reading STS's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e stsError
		_ = xml.Unmarshal(body, &e)
		if resp.StatusCode/100 == 4 && slices.Contains(signatureErrors, e.Error.Code) {
			return Identity{}, fmt.Errorf("%w: %s: %s", ErrForged, e.Error.Code, e.Error.Message)
		}
		return Identity{}, fmt.Errorf("STS answered %d %s: %s (the proof could not be checked)", resp.StatusCode, e.Error.Code, e.Error.Message)
	}
	var ok stsIdentity
	if err := xml.Unmarshal(body, &ok); err != nil {
		return Identity{}, fmt.Errorf("STS's GetCallerIdentity answer: %w", err)
	}
	id := Identity{ARN: ok.Result.Arn, Account: ok.Result.Account, UserID: ok.Result.UserID}
	if id.ARN == "" || len(id.Account) != 12 {
		return Identity{}, fmt.Errorf("STS's GetCallerIdentity answer has no identity: %.200s", body)
	}
	if err := v.admit(id); err != nil {
		if !errors.Is(err, ErrNotAdmitted) {
			err = fmt.Errorf("%w: %w", ErrNotAdmitted, err)
		}
		return id, err
	}
	return id, nil
}

// signatureErrors are STS's error codes for a request whose signature or
// credentials do not hold (as opposed to throttling or an outage).
var signatureErrors = []string{
	"SignatureDoesNotMatch", "IncompleteSignature", "InvalidClientTokenId", "ExpiredToken",
	"AccessDenied", "MissingAuthenticationToken", "InvalidParameterValue", "InvalidQueryParameter",
	"MalformedQueryString", "RequestExpired",
}

// query checks the proof's parts and returns the presigned request's query:
// only what a presigned GetCallerIdentity has, one value each.
func (v *Verifier) query(p *Proof) (url.Values, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	if p.Version != Version {
		return nil, bad("version %d, want %d", p.Version, Version)
	}
	if p.Host != v.endpoint.Host {
		return nil, bad("signed for STS host %q; this function verifies with %q (the sender must resolve the same STS endpoint)", p.Host, v.endpoint.Host)
	}
	date, err := time.Parse(amzDate, p.Date)
	if err != nil {
		return nil, bad("X-Amz-Date %q", p.Date)
	}
	now := v.Now()
	if age := now.Sub(date); age > Window || age < -Window {
		return nil, fmt.Errorf("%w: signed at %s, %s from this function's clock (at most %s)", ErrStale, date.Format(time.RFC3339), age.Round(time.Second), Window)
	}
	if n, err := strconv.Atoi(p.Expires); err != nil || n < 1 || n > int(stsValidity/time.Second) {
		return nil, bad("X-Amz-Expires %q", p.Expires)
	}
	// ACCESSKEY/YYYYMMDD/REGION/sts/aws4_request
	cred := strings.Split(p.Credential, "/")
	if len(cred) != 5 || cred[0] == "" || cred[1] != p.Date[:8] || cred[2] == "" || cred[3] != "sts" || cred[4] != "aws4_request" {
		return nil, bad("X-Amz-Credential %q", p.Credential)
	}
	if p.SignedHeaders != "host;"+strings.ToLower(Header) {
		return nil, bad("signed headers %q, want exactly host;%s", p.SignedHeaders, strings.ToLower(Header))
	}
	if sig, err := hex.DecodeString(p.Signature); err != nil || len(sig) != 32 {
		return nil, bad("signature %q", p.Signature)
	}
	if len(p.SecurityToken) > 8192 {
		return nil, bad("a security token of %d bytes", len(p.SecurityToken))
	}
	q := url.Values{}
	q.Set("Action", "GetCallerIdentity")
	q.Set("Version", "2011-06-15")
	q.Set("X-Amz-Algorithm", "AWS4-HMAC-SHA256")
	q.Set("X-Amz-Credential", p.Credential)
	q.Set("X-Amz-Date", p.Date)
	q.Set("X-Amz-Expires", p.Expires)
	q.Set("X-Amz-SignedHeaders", p.SignedHeaders)
	q.Set("X-Amz-Signature", p.Signature)
	if p.SecurityToken != "" {
		q.Set("X-Amz-Security-Token", p.SecurityToken)
	}
	return q, nil
}

// redact drops the URL (it carries the signature and the session token)
// from an HTTP client error.
func redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

type stsIdentity struct {
	Result struct {
		Arn     string `xml:"Arn"`
		UserID  string `xml:"UserId"`
		Account string `xml:"Account"`
	} `xml:"GetCallerIdentityResult"`
}

type stsError struct {
	Error struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	} `xml:"Error"`
}
