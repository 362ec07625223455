package invokeproof

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Signer makes proofs with the credentials of an AWS configuration (in
// Lambda: the function's role). Signing is local: it calls nothing.
type Signer struct {
	presign *sts.PresignClient
	// Now is the signing clock (tests set it to make old proofs).
	Now func() time.Time
}

// NewSigner signs with cfg's credentials for the STS endpoint cfg resolves
// (the region's, https://sts.REGION.amazonaws.com, unless
// AWS_ENDPOINT_URL_STS or AWS_USE_DUALSTACK_ENDPOINT say otherwise; the
// receiver must resolve the same).
func NewSigner(cfg aws.Config) *Signer {
	return &Signer{presign: sts.NewPresignClient(sts.NewFromConfig(cfg)), Now: time.Now}
}

// Sign marshals payload and returns it with a proof for audience.
func (s *Signer) Sign(ctx context.Context, audience string, payload any) (Envelope, error) {
	raw, err := json.Marshal(payload)
	if err != nil {
		return Envelope{}, fmt.Errorf("encoding the request: %w", err)
	}
	p, err := s.Prove(ctx, audience, raw)
	if err != nil {
		return Envelope{}, err
	}
	return Envelope{Payload: raw, Proof: &p}, nil
}

// Prove presigns a GetCallerIdentity bound to the payload's exact bytes.
func (s *Signer) Prove(ctx context.Context, audience string, payload []byte) (Proof, error) {
	digest := Digest(audience, payload)
	req, err := s.presign.PresignGetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}, func(o *sts.PresignOptions) {
		o.Presigner = clockedPresigner{signer: v4.NewSigner(), now: s.Now}
		o.ClientOptions = append(o.ClientOptions, func(c *sts.Options) {
			c.APIOptions = append(c.APIOptions,
				smithyhttp.AddHeaderValue(Header, digest),
				// Hoisted into the query by the signer. STS ignores it
				// (it accepts a presigned request for 15 minutes); the
				// Verifier enforces Window on the date itself.
				smithyhttp.AddHeaderValue("X-Amz-Expires", strconv.Itoa(int(Window/time.Second))),
			)
		})
	})
	if err != nil {
		return Proof{}, fmt.Errorf("signing the request's proof (sts:GetCallerIdentity presign): %w", err)
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		return Proof{}, fmt.Errorf("the presigned request's URL: %w", err)
	}
	q := u.Query()
	if q.Get("X-Amz-Signature") == "" || req.Method != http.MethodGet {
		return Proof{}, fmt.Errorf("the presigned request is not a signed GET (%s %s)", req.Method, u.Redacted())
	}
	return Proof{
		Version:       Version,
		Host:          u.Host,
		Credential:    q.Get("X-Amz-Credential"),
		Date:          q.Get("X-Amz-Date"),
		Expires:       q.Get("X-Amz-Expires"),
		SignedHeaders: q.Get("X-Amz-SignedHeaders"),
		Signature:     q.Get("X-Amz-Signature"),
		SecurityToken: q.Get("X-Amz-Security-Token"),
	}, nil
}

// clockedPresigner is the SDK's SigV4 presigner with the Signer's clock.
type clockedPresigner struct {
	signer *v4.Signer
	now    func() time.Time
}

func (p clockedPresigner) PresignHTTP(ctx context.Context, creds aws.Credentials, r *http.Request, payloadHash, service, region string, _ time.Time, optFns ...func(*v4.SignerOptions)) (string, http.Header, error) {
	return p.signer.PresignHTTP(ctx, creds, r, payloadHash, service, region, p.now(), optFns...)
}
