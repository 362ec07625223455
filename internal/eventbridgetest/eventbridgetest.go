// Package eventbridgetest is a stand-in for Amazon EventBridge's PutEvents,
// for tests, the local runner and the fault suite: an HTTP server speaking
// the AWS JSON 1.1 protocol (POST /, X-Amz-Target: AWSEvents.PutEvents,
// Content-Type application/x-amz-json-1.1), reached with the real SDK
// through its endpoint setting (AWS_ENDPOINT_URL_EVENTBRIDGE, or
// eventbridge.Options.BaseEndpoint). It checks what EventBridge checks (at
// most 10 entries and 256 KB per call, each entry with Source, DetailType
// and a JSON object as Detail, the bus exists), records the entries it
// accepts, and can be told to misbehave: fail some entries (FailedEntryCount
// with an ErrorCode each), throttle calls or entries, answer 5xx, or hold a
// call until released.
//
// The wire format is the SDK's (aws-sdk-go-v2/service/eventbridge v1.55.11
// with smithy-go's awsjson protocol): Time is epoch seconds; an error is a
// non-2xx status with {"__type": code, "message": text}.
package eventbridgetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
)

// Limits PutEvents enforces per call.
const (
	MaxEntries = 10
	MaxBytes   = 256 * 1024
)

// Event is an entry the stand-in accepted.
type Event struct {
	ID         string          // the EventId it answered
	Bus        string          // EventBusName
	Source     string          // Source
	DetailType string          // DetailType
	Detail     json.RawMessage // Detail
	Time       time.Time       // Time (zero when not sent)
	Call       int             // which call (1-based) carried it
}

// OutboxID is the detail's outbox_id (0 when absent).
func (e Event) OutboxID() int64 {
	var d struct {
		OutboxID int64 `json:"outbox_id"`
	}
	_ = json.Unmarshal(e.Detail, &d)
	return d.OutboxID
}

// Entry is an entry of a call, as Fault sees it.
type Entry struct {
	Bus, Source, DetailType, Detail string
}

// Fault decides the fate of a call (call is 1-based): return a non-empty
// callError to fail the whole call (with status), or per-entry error codes
// (entryErrors[i] non-empty fails entry i; nil: none fail).
type Fault func(call int, entries []Entry) (status int, callError string, entryErrors []string)

// Server is the stand-in.
type Server struct {
	*httptest.Server
	// Buses are the buses that exist; a call naming another gets
	// ResourceNotFoundException. Empty: any bus.
	Buses []string

	mu       sync.Mutex
	calls    int
	events   []Event
	faults   []Fault
	hold     func(call int, r *http.Request) // called (outside the lock) before answering
	rejected int
	nextID   int
}

// New starts a stand-in accepting calls for buses (none: any bus); it is
// closed when t ends.
func New(t interface{ Cleanup(func()) }, buses ...string) *Server {
	s := &Server{Buses: buses}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// NewServer starts a stand-in that the caller closes (the local runner).
func NewServer(buses ...string) *Server {
	s := &Server{Buses: buses}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// AddFault adds f; every call goes through the faults in order, and the
// first that fails the call, or any entry, decides.
func (s *Server) AddFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// Hold makes every call wait for fn(call, request) to return before it is
// answered (nil: answer at once). fn runs after the entries were accepted
// and recorded: the moment between PutEvents and the caller's mark. The
// request tells callers apart (its User-Agent carries the SDK's app id,
// AWS_SDK_UA_APP_ID).
func (s *Server) Hold(fn func(call int, r *http.Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = fn
}

// ThrottleCalls throttles the next n calls as a whole (400
// ThrottlingException).
func (s *Server) ThrottleCalls(n int) {
	left := n
	var mu sync.Mutex
	s.AddFault(func(int, []Entry) (int, string, []string) {
		mu.Lock()
		defer mu.Unlock()
		if left <= 0 {
			return 0, "", nil
		}
		left--
		return http.StatusBadRequest, "ThrottlingException", nil
	})
}

// FailCalls answers the next n calls with status (a 5xx: InternalException).
func (s *Server) FailCalls(n, status int) {
	left := n
	var mu sync.Mutex
	s.AddFault(func(int, []Entry) (int, string, []string) {
		mu.Lock()
		defer mu.Unlock()
		if left <= 0 {
			return 0, "", nil
		}
		left--
		return status, "InternalException", nil
	})
}

// FailEntries fails each entry for which pick returns an error code (for
// example "InternalFailure" or "ThrottlingException"), until pick returns
// "" for it.
func (s *Server) FailEntries(pick func(e Entry) string) {
	s.AddFault(func(_ int, es []Entry) (int, string, []string) {
		codes := make([]string, len(es))
		for i, e := range es {
			codes[i] = pick(e)
		}
		return 0, "", codes
	})
}

// Events returns the entries accepted so far, in order.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Calls returns how many PutEvents calls arrived.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Published counts the accepted entries per outbox_id.
func (s *Server) Published() map[int64]int {
	m := map[int64]int{}
	for _, e := range s.Events() {
		m[e.OutboxID()]++
	}
	return m
}

type requestEntry struct {
	EventBusName string   `json:"EventBusName"`
	Source       *string  `json:"Source"`
	DetailType   *string  `json:"DetailType"`
	Detail       *string  `json:"Detail"`
	Resources    []string `json:"Resources"`
	Time         *float64 `json:"Time"`
}

type resultEntry struct {
	EventID      string `json:"EventId,omitempty"`
	ErrorCode    string `json:"ErrorCode,omitempty"`
	ErrorMessage string `json:"ErrorMessage,omitempty"`
}

// PublishedPath answers GET with the accepted entries' details, a JSON
// array in the order accepted: how a process that runs the stand-in (the
// fault suite's) lets a checker see what was published.
const PublishedPath = "/_standin/published"

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == PublishedPath {
		details := []json.RawMessage{}
		for _, e := range s.Events() {
			details = append(details, e.Detail)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(details)
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/" {
		apiError(w, http.StatusNotFound, "UnknownOperationException", "not found")
		return
	}
	if target := r.Header.Get("X-Amz-Target"); target != "AWSEvents.PutEvents" {
		apiError(w, http.StatusBadRequest, "UnknownOperationException", "operation "+target+" is not supported by this stand-in")
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-amz-json-1.1" {
		apiError(w, http.StatusBadRequest, "SerializationException", "content type "+ct)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		apiError(w, http.StatusBadRequest, "MissingAuthenticationTokenException", "request is not signed")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		apiError(w, http.StatusBadRequest, "SerializationException", err.Error())
		return
	}
	var in struct {
		Entries []requestEntry `json:"Entries"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		apiError(w, http.StatusBadRequest, "SerializationException", err.Error())
		return
	}

	s.mu.Lock()
	s.calls++
	call := s.calls
	faults := append([]Fault(nil), s.faults...)
	s.mu.Unlock()

	if n := len(in.Entries); n == 0 || n > MaxEntries {
		apiError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("1 validation error detected: Value at 'entries' failed to satisfy constraint: Member must have length between 1 and %d (got %d)", MaxEntries, n))
		return
	}
	entries := make([]Entry, len(in.Entries))
	total := 0
	for i, e := range in.Entries {
		entries[i] = Entry{Bus: e.EventBusName, Source: deref(e.Source), DetailType: deref(e.DetailType), Detail: deref(e.Detail)}
		total += size(e)
		if len(s.Buses) > 0 && !contains(s.Buses, e.EventBusName) {
			apiError(w, http.StatusBadRequest, "ResourceNotFoundException", "Event bus "+e.EventBusName+" does not exist.")
			return
		}
	}
	if total > MaxBytes {
		apiError(w, http.StatusBadRequest, "ValidationException", fmt.Sprintf("Total size of the entries in the request is over the limit (%d > %d bytes).", total, MaxBytes))
		return
	}
	codes := make([]string, len(entries))
	for _, f := range faults {
		status, callErr, entryErrs := f(call, entries)
		if callErr != "" {
			apiError(w, status, callErr, "injected by the stand-in")
			return
		}
		if anyNonEmpty(entryErrs) {
			copy(codes, entryErrs)
			break
		}
	}
	out := struct {
		FailedEntryCount int           `json:"FailedEntryCount"`
		Entries          []resultEntry `json:"Entries"`
	}{Entries: make([]resultEntry, len(entries))}
	s.mu.Lock()
	for i, e := range in.Entries {
		switch {
		case codes[i] == "" && e.Source == nil:
			codes[i] = "InvalidArgument"
		case codes[i] == "" && e.DetailType == nil:
			codes[i] = "InvalidArgument"
		case codes[i] == "" && !jsonObject(e.Detail):
			codes[i] = "MalformedDetail"
		}
		if codes[i] != "" {
			out.FailedEntryCount++
			out.Entries[i] = resultEntry{ErrorCode: codes[i], ErrorMessage: "stand-in: " + codes[i]}
			s.rejected++
			continue
		}
		s.nextID++
		ev := Event{ID: fmt.Sprintf("standin-%08d", s.nextID), Bus: e.EventBusName, Source: *e.Source, DetailType: *e.DetailType,
			Detail: json.RawMessage(*e.Detail), Call: call}
		if e.Time != nil {
			sec := int64(*e.Time)
			ev.Time = time.Unix(sec, int64((*e.Time-float64(sec))*1e9)).UTC()
		}
		s.events = append(s.events, ev)
		out.Entries[i] = resultEntry{EventID: ev.ID}
	}
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		hold(call, r)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(out)
}

// size is the entry's size as AWS counts it (14 bytes for Time, and the
// bytes of Source, DetailType, Detail and Resources).
func size(e requestEntry) int {
	n := len(deref(e.Source)) + len(deref(e.DetailType)) + len(deref(e.Detail))
	if e.Time != nil {
		n += 14
	}
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func jsonObject(s *string) bool {
	if s == nil {
		return false
	}
	var m map[string]json.RawMessage
	return json.Unmarshal([]byte(*s), &m) == nil
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func anyNonEmpty(xs []string) bool {
	for _, x := range xs {
		if x != "" {
			return true
		}
	}
	return false
}

// Region and static test credentials the stand-in's clients use.
const (
	Region    = "us-east-1"
	AccessKey = "AKIDSTANDIN"
	SecretKey = "stand-in-secret"
)

// Env is the AWS SDK's usual configuration pointing a process at the
// stand-in: AWS_ENDPOINT_URL_EVENTBRIDGE, AWS_REGION and static
// credentials, as KEY=value pairs.
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_EVENTBRIDGE=" + s.URL,
		"AWS_REGION=" + Region,
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
	}
}

// Client is the real SDK client, pointed at the stand-in through its
// endpoint setting (BaseEndpoint, what AWS_ENDPOINT_URL_EVENTBRIDGE sets).
// opts may change the options, e.g. RetryMaxAttempts.
func (s *Server) Client(opts ...func(*eventbridge.Options)) *eventbridge.Client {
	o := eventbridge.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.URL),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey, Source: "eventbridgetest"}, nil
		}),
	}
	for _, f := range opts {
		f(&o)
	}
	return eventbridge.New(o)
}
