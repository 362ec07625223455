// Package invokeproof proves who sent a Lambda invocation's payload, for the
// functions that write money-relevant rows without a Stripe signature (the
// reconciler's store function; the write-back functions) and for the ops
// function's audit trail.
//
// Lambda does not tell a function who invoked it: for an IAM-authorized
// Invoke the context carries no caller identity (aws-lambda-go's
// lambdacontext.LambdaContext has the request id, the function ARN and the
// mobile SDK's Cognito and client contexts, which any caller may set), and a
// function's resource policy cannot deny what an identity policy allows
// (Lambda resource policies hold Allow statements only). So any role with
// lambda:InvokeFunction on "*" could invoke a store function. This package
// makes the sender prove its identity in the payload itself.
//
// # The proof
//
// The sender presigns an STS GetCallerIdentity request with its own AWS
// credentials (SigV4 query authentication), with one more signed header,
// X-Inbox-Invoke-Proof, whose value is Digest(audience, payload): a SHA-256
// over a fixed label, the audience (which kind of request it is, e.g.
// "reconcilestore") and the SHA-256 of the exact payload bytes. The payload
// and the presigned request's parameters travel together as an Envelope.
//
// The receiver (Verifier) recomputes the digest from the payload it was
// given and sends the presigned GetCallerIdentity to STS itself, with that
// header. STS answers with the signer's ARN only if the signature matches,
// which it can only do if the header value is the one that was signed: a
// changed payload, another audience or a forged signature is refused by
// STS, and the ARN STS returns is then checked against the principals the
// receiver admits (for the store: the reconciler's role). This is the
// pattern of Vault's AWS auth method and of EKS's aws-iam-authenticator
// tokens; the checks on the presigned request's parameters follow the
// latter's verifier (exactly the parameters STS needs, one value each, the
// action fixed by the receiver, the host the receiver's own SDK resolves).
//
// Why not an HMAC key in Secrets Manager, or a KMS signing key: with an HMAC
// key, anyone who reads the secret once (an admin with
// secretsmanager:GetSecretValue on "*", before or around a resource policy)
// can forge requests offline, forever and without a trace, and the verifier
// holds the same key as the signer. A KMS asymmetric key fixes that, but the
// store in the VPC then needs a route to KMS (an interface endpoint, about
// $14.60 a month in two AZs, on top of the key's $1) or the public key
// delivered at deploy (CDK's AwsCustomResource cannot return KMS's binary
// public key, aws-cdk#19065). The presigned request needs no key at all:
// the credentials are the role's own short-lived ones, nothing can leak that
// outlives them, and the route the store needs (to STS) is the one the ops
// function needs anyway to learn its callers' verified identity. Forging a
// proof takes the admitted role's credentials, that is, a change to its
// trust policy or a function created with it (iam:PassRole), each a
// CloudTrail management event.
//
// # Freshness and replay
//
// STS accepts a presigned request for 15 minutes after its X-Amz-Date,
// whatever X-Amz-Expires says (aws-sdk-go#2167; aws-iam-authenticator
// validates the date itself for that reason). The Verifier refuses a proof
// whose date is more than Window (5 minutes) old or ahead, before asking
// STS. Within the window an envelope can be replayed byte for byte; it is
// bound to its payload, so a replay repeats the same request, and every
// request this package protects is idempotent (a store of the same events
// stores nothing new, an advance of the mark never moves it back, an
// operator's command is audited again under the same verified identity).
//
// # Reuse
//
// A function that writes receipts, bookings or write-backs from a payload
// without a Stripe signature takes an Envelope, verifies it with its own
// audience, and counts a refusal (Reason) in a metric with an alarm. A
// function fed by a queue (the EventBridge ingest) can instead ignore its
// payload and read the queue itself: a queue policy admits only the
// producer, but anyone allowed lambda:InvokeFunction can still invoke a
// queue-triggered function with a made-up SQS event, so the payload of such
// an invocation must not be trusted either.
package invokeproof

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Header is the signed header that binds a presigned GetCallerIdentity to a
// payload.
const Header = "X-Inbox-Invoke-Proof"

// Version is the envelope's proof format.
const Version = 1

// Window is how old (or how far ahead of the receiver's clock) a proof's
// date may be.
const Window = 5 * time.Minute

// stsValidity is how long STS itself accepts a presigned request after its
// X-Amz-Date (aws-sdk-go#2167).
const stsValidity = 15 * time.Minute

// MaxPayload bounds the payload a Verifier hashes: Lambda's synchronous
// payload quota is 6 MB
// (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).
const MaxPayload = 6 << 20

// Envelope is a proven request: the payload as the sender marshalled it
// (its exact bytes are what the proof covers) and the proof.
type Envelope struct {
	Payload json.RawMessage `json:"payload"`
	Proof   *Proof          `json:"proof,omitempty"`
}

// Proof is a presigned STS GetCallerIdentity request, by its parts (the
// receiver builds the URL itself: Action and Version are its own, and the
// host must be the one it resolves).
type Proof struct {
	Version int `json:"v"`
	// Host is the STS host the request was signed for.
	Host string `json:"host"`
	// The SigV4 query parameters (X-Amz-Credential, X-Amz-Date,
	// X-Amz-Expires, X-Amz-SignedHeaders, X-Amz-Signature,
	// X-Amz-Security-Token).
	Credential    string `json:"credential"`
	Date          string `json:"date"`
	Expires       string `json:"expires"`
	SignedHeaders string `json:"signed_headers"`
	Signature     string `json:"signature"`
	SecurityToken string `json:"security_token,omitempty"`
}

// Identity is the principal STS verified.
type Identity struct {
	// ARN as STS returns it: arn:aws:sts::123456789012:assumed-role/NAME/SESSION
	// for a role session, arn:aws:iam::123456789012:user/NAME for a user.
	ARN     string `json:"arn"`
	Account string `json:"account"`
	// UserID is the unique id: AROA...:SESSION for a role session.
	UserID string `json:"user_id"`
}

// Role returns the role name and session of an assumed-role ARN (ok false
// for any other principal).
func (i Identity) Role() (name, session string, ok bool) {
	_, resource, ok := splitARN(i.ARN, "sts")
	if !ok {
		return "", "", false
	}
	parts := strings.Split(resource, "/")
	if len(parts) != 3 || parts[0] != "assumed-role" || parts[1] == "" || parts[2] == "" {
		return "", "", false
	}
	return parts[1], parts[2], true
}

// splitARN returns the account and resource of arn:PARTITION:SERVICE::ACCOUNT:RESOURCE.
func splitARN(arn, service string) (account, resource string, ok bool) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" || parts[1] == "" || parts[2] != service || parts[3] != "" || len(parts[4]) != 12 {
		return "", "", false
	}
	return parts[4], parts[5], true
}

// Digest is the X-Inbox-Invoke-Proof value for a payload sent to audience.
func Digest(audience string, payload []byte) string {
	p := sha256.Sum256(payload)
	d := sha256.Sum256([]byte("stripe-inbox/invokeproof/v1\n" + audience + "\n" + hex.EncodeToString(p[:])))
	return hex.EncodeToString(d[:])
}

// Refusals. A Verifier's error wraps exactly one of them when the request
// is refused; any other error is a failure to verify (STS unreachable),
// which is not the sender's fault.
var (
	// ErrNoProof: the payload came without a proof.
	ErrNoProof = errors.New("the request carries no proof of its sender")
	// ErrMalformed: the proof is not a presigned GetCallerIdentity this
	// package made.
	ErrMalformed = errors.New("the request's proof is malformed")
	// ErrStale: the proof is older (or further ahead) than Window: an old
	// request, or a replay.
	ErrStale = errors.New("the request's proof is outside its time window (old or replayed)")
	// ErrForged: STS refused the signature (another payload or audience, a
	// made-up or expired signature).
	ErrForged = errors.New("STS refused the request's proof")
	// ErrNotAdmitted: the proof is genuine but its signer is not a principal
	// the receiver admits.
	ErrNotAdmitted = errors.New("the request's signer is not admitted")
)

// Reason is the short name of a refusal, for the metric's Reason
// dimension: missing, malformed, stale, forged, principal; "" for anything
// else.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNoProof):
		return "missing"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrStale):
		return "stale"
	case errors.Is(err, ErrForged):
		return "forged"
	case errors.Is(err, ErrNotAdmitted):
		return "principal"
	}
	return ""
}

// Refused reports whether err is a refusal (the sender's fault) rather
// than a failure to verify.
func Refused(err error) bool { return Reason(err) != "" }

// Admit decides whether a verified identity may send the request.
type Admit func(Identity) error

// Role admits the sessions of one IAM role, given by its ARN
// (arn:aws:iam::ACCOUNT:role/[PATH/]NAME): STS reports a Lambda function's
// identity as arn:aws:sts::ACCOUNT:assumed-role/NAME/FUNCTION.
func Role(roleARN string) (Admit, error) {
	account, resource, ok := splitARN(roleARN, "iam")
	name, hasRole := strings.CutPrefix(resource, "role/")
	if !ok || !hasRole || name == "" {
		return nil, fmt.Errorf("%q is not an IAM role ARN (arn:aws:iam::123456789012:role/NAME)", roleARN)
	}
	if i := strings.LastIndex(name, "/"); i >= 0 { // a path: the session ARN has only the name
		name = name[i+1:]
	}
	return func(id Identity) error {
		got, _, isRole := id.Role()
		if !isRole || got != name || id.Account != account {
			return fmt.Errorf("%w: %s is not a session of role %s", ErrNotAdmitted, id.ARN, roleARN)
		}
		return nil
	}, nil
}

// Account admits any principal of one AWS account (the ops function: IAM
// decides who may invoke it, the proof says who did).
func Account(account string) (Admit, error) {
	if len(account) != 12 || strings.Trim(account, "0123456789") != "" {
		return nil, fmt.Errorf("%q is not an AWS account id", account)
	}
	return func(id Identity) error {
		if id.Account != account {
			return fmt.Errorf("%w: %s is a principal of account %s, not %s", ErrNotAdmitted, id.ARN, id.Account, account)
		}
		return nil
	}, nil
}

// Anyone admits every verified identity: for a receiver that applies its
// own rule to the identity afterwards (the ops function: its own account,
// known per invocation).
func Anyone(Identity) error { return nil }
