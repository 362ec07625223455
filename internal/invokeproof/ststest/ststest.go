// Package ststest is a stand-in for AWS STS's GetCallerIdentity, for tests
// and the e2e suite: an HTTP server that answers a SigV4 presigned
// GetCallerIdentity (query authentication, the AWS Query protocol's XML
// answer) the way STS does, reached by internal/invokeproof (and the SDK)
// through AWS_ENDPOINT_URL_STS or an explicit endpoint.
//
// It checks the signature for real: it knows each fake access key's secret
// and the principal it belongs to, recomputes the SigV4 signature of the
// request it received (canonical request over the method, path, query
// without the signature, the signed headers with the values it received,
// and the empty payload's hash), and answers 403 SignatureDoesNotMatch when
// it differs, InvalidClientTokenId for an unknown key, and "Signature
// expired" 15 minutes after X-Amz-Date, as STS does for presigned requests
// whatever X-Amz-Expires says (aws-sdk-go#2167). It can be told to fail
// (5xx, throttling) or to hold calls until released.
//
// SigV4: https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html
// STS GetCallerIdentity: https://docs.aws.amazon.com/STS/latest/APIReference/API_GetCallerIdentity.html
package ststest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Account is the stand-in's account id.
const Account = "123456789012"

// Principal is a fake credential and who it belongs to.
type Principal struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string // required on the request when set
	ARN             string // what GetCallerIdentity answers
	UserID          string
	Account         string // "": Account
}

// Credentials is the principal's credentials for an aws.Config.
func (p Principal) Credentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(p.AccessKeyID, p.SecretAccessKey, p.SessionToken)
}

// RoleSession is a principal for a session of role name in Account, as STS
// reports a Lambda function's identity (session = the function's name).
func RoleSession(name, session, accessKeyID string) Principal {
	return Principal{
		AccessKeyID:     accessKeyID,
		SecretAccessKey: "secret-of-" + accessKeyID,
		SessionToken:    "token-of-" + accessKeyID + "/with+base64=chars",
		ARN:             fmt.Sprintf("arn:aws:sts::%s:assumed-role/%s/%s", Account, name, session),
		UserID:          "AROA" + strings.ToUpper(accessKeyID) + ":" + session,
	}
}

// RoleARN is the IAM ARN of role name in Account.
func RoleARN(name string) string { return fmt.Sprintf("arn:aws:iam::%s:role/%s", Account, name) }

// Server is the stand-in.
type Server struct {
	URL string
	// Now is STS's clock.
	Now func() time.Time

	mu         sync.Mutex
	principals map[string]Principal
	calls      int
	failures   []failure
	held       chan struct{} // non-nil: calls wait until it is closed
	violations []string
}

type failure struct {
	status int
	code   string
}

// New starts a stand-in on loopback knowing ps; it stops with t.
func New(t testing.TB, ps ...Principal) *Server {
	t.Helper()
	s := &Server{Now: time.Now, principals: map[string]Principal{}}
	for _, p := range ps {
		s.Add(p)
	}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	t.Cleanup(s.Release) // before srv.Close, which waits for held calls
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, v := range s.violations {
			t.Errorf("STS stand-in: %s", v)
		}
	})
	s.URL = srv.URL
	return s
}

// Add makes p known.
func (s *Server) Add(p Principal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.principals[p.AccessKeyID] = p
}

// Calls is how many requests the stand-in received.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Fail makes the next n calls answer status with an error code (e.g. 500
// InternalFailure, 400 Throttling).
func (s *Server) Fail(n, status int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.failures = append(s.failures, failure{status, code})
	}
}

// Hold makes calls wait until Release (or the caller gives up).
func (s *Server) Hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = make(chan struct{})
	}
}

// Release lets held calls answer.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls++
	held := s.held
	var fail *failure
	if len(s.failures) > 0 {
		fail = &s.failures[0]
		s.failures = s.failures[1:]
	}
	s.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-r.Context().Done():
			return
		}
	}
	if fail != nil {
		writeError(w, fail.status, fail.code, "stand-in failure")
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != "/" {
		s.violation("%s %s: a presigned GetCallerIdentity is GET /", r.Method, r.URL.Path)
		writeError(w, http.StatusBadRequest, "InvalidAction", "not a presigned GetCallerIdentity")
		return
	}
	p, status, code, msg := s.check(r)
	if status != http.StatusOK {
		writeError(w, status, code, msg)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <GetCallerIdentityResult>
    <Arn>%s</Arn>
    <UserId>%s</UserId>
    <Account>%s</Account>
  </GetCallerIdentityResult>
  <ResponseMetadata><RequestId>00000000-0000-4000-8000-000000000000</RequestId></ResponseMetadata>
</GetCallerIdentityResponse>`, esc(p.ARN), esc(p.UserID), p.account())
}

func (p Principal) account() string {
	if p.Account != "" {
		return p.Account
	}
	return Account
}

func (s *Server) violation(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// check verifies the presigned request as STS would.
func (s *Server) check(r *http.Request) (Principal, int, string, string) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return Principal{}, 400, "MalformedQueryString", err.Error()
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return Principal{}, 400, "InvalidQueryParameter", "parameter " + k + " given more than once"
		}
	}
	if q.Get("Action") != "GetCallerIdentity" || q.Get("Version") != "2011-06-15" {
		return Principal{}, 400, "InvalidAction", fmt.Sprintf("action %q version %q", q.Get("Action"), q.Get("Version"))
	}
	if q.Get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" {
		return Principal{}, 400, "IncompleteSignature", "X-Amz-Algorithm"
	}
	cred := strings.Split(q.Get("X-Amz-Credential"), "/")
	if len(cred) != 5 || cred[3] != "sts" || cred[4] != "aws4_request" {
		return Principal{}, 400, "IncompleteSignature", "X-Amz-Credential " + q.Get("X-Amz-Credential")
	}
	s.mu.Lock()
	p, known := s.principals[cred[0]]
	s.mu.Unlock()
	if !known {
		return Principal{}, 403, "InvalidClientTokenId", "The security token included in the request is invalid."
	}
	if p.SessionToken != q.Get("X-Amz-Security-Token") {
		return Principal{}, 403, "InvalidClientTokenId", "The security token included in the request is invalid."
	}
	date, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil || cred[1] != date.Format("20060102") {
		return Principal{}, 400, "IncompleteSignature", "X-Amz-Date " + q.Get("X-Amz-Date")
	}
	now := s.Now()
	if now.After(date.Add(15 * time.Minute)) {
		return Principal{}, 403, "SignatureDoesNotMatch", fmt.Sprintf("Signature expired: %s is now earlier than %s (%s - 15 min.)",
			q.Get("X-Amz-Date"), now.Add(-15*time.Minute).UTC().Format("20060102T150405Z"), now.UTC().Format("20060102T150405Z"))
	}
	if date.After(now.Add(15 * time.Minute)) {
		return Principal{}, 403, "SignatureDoesNotMatch", "Signature not yet current: " + q.Get("X-Amz-Date")
	}
	if want := Signature(p.SecretAccessKey, r.Method, r.URL.Path, q, r.Host, r.Header, cred[2], date); !hmac.Equal([]byte(want), []byte(q.Get("X-Amz-Signature"))) {
		return Principal{}, 403, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided."
	}
	return p, http.StatusOK, "", ""
}

// Signature is the SigV4 query signature of a presigned STS request: q
// without X-Amz-Signature, the headers X-Amz-SignedHeaders names (host's
// value is host), an empty payload.
func Signature(secret, method, path string, q url.Values, host string, h http.Header, region string, date time.Time) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		if k != "X-Amz-Signature" {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return encode(keys[i]) < encode(keys[j]) })
	var query []string
	for _, k := range keys {
		query = append(query, encode(k)+"="+encode(q.Get(k)))
	}
	signed := strings.Split(q.Get("X-Amz-SignedHeaders"), ";")
	var headers strings.Builder
	for _, name := range signed {
		v := h.Get(name)
		if name == "host" {
			v = host
		}
		headers.WriteString(name + ":" + strings.TrimSpace(v) + "\n")
	}
	empty := sha256.Sum256(nil)
	canonical := strings.Join([]string{method, path, strings.Join(query, "&"), headers.String(), q.Get("X-Amz-SignedHeaders"), hex.EncodeToString(empty[:])}, "\n")
	day := date.UTC().Format("20060102")
	scope := day + "/" + region + "/sts/aws4_request"
	ch := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + date.UTC().Format("20060102T150405Z") + "\n" + scope + "\n" + hex.EncodeToString(ch[:])
	k := mac([]byte("AWS4"+secret), day)
	k = mac(k, region)
	k = mac(k, "sts")
	k = mac(k, "aws4_request")
	return hex.EncodeToString(mac(k, toSign))
}

func mac(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// encode is SigV4's URI encoding: everything but A-Z a-z 0-9 - _ . ~.
func encode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	typ := "Sender"
	if status >= 500 {
		typ = "Receiver"
	}
	fmt.Fprintf(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>%s</Type><Code>%s</Code><Message>%s</Message></Error>
  <RequestId>00000000-0000-4000-8000-000000000000</RequestId>
</ErrorResponse>`, typ, esc(code), esc(msg))
}

// Config is an aws.Config for p that reaches the stand-in.
func (s *Server) Config(p Principal) aws.Config {
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  p.Credentials(),
		BaseEndpoint: aws.String(s.URL),
	}
}
