//go:build linux

package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// secretStore is a stand-in for AWS Secrets Manager that speaks the
// GetSecretValue call of its JSON protocol (awsJson1_1), on loopback. The
// webhook reaches it through AWS_ENDPOINT_URL_SECRETS_MANAGER, the SDK's
// own endpoint override, so the production client code runs unchanged.
//
// A secret can be stalled: its GetSecretValue calls then block, for real,
// until the test releases them or the caller gives up (the SDK closes the
// connection when its context ends), which the store counts as abandoned.
type secretStore struct {
	URL string

	mu         sync.Mutex
	values     map[string]string // by ARN
	versions   map[string]int
	calls      map[string]int
	stalled    map[string]chan struct{} // closed to release
	abandoned  map[string]int
	changed    chan struct{} // closed and replaced on every change of the counters
	violations []string
}

func newSecretStore(t *testing.T, values map[string]string) *secretStore {
	t.Helper()
	s := &secretStore{values: map[string]string{}, versions: map[string]int{}, calls: map[string]int{},
		stalled: map[string]chan struct{}{}, abandoned: map[string]int{}, changed: make(chan struct{})}
	for arn, v := range values {
		s.set(arn, v)
	}
	srv := httptest.NewServer(http.HandlerFunc(s.serve)) // 127.0.0.1:0
	t.Cleanup(srv.Close)
	// Runs before srv.Close, which waits for every handler to return.
	t.Cleanup(s.releaseAll)
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, v := range s.violations {
			t.Errorf("Secrets Manager stand-in: %s", v)
		}
	})
	s.URL = srv.URL
	return s
}

// set stores a new version of the secret arn.
func (s *secretStore) set(arn, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.values[arn] = value
	s.versions[arn]++
}

// stall makes the following GetSecretValue calls for arn block until
// release.
func (s *secretStore) stall(arn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled[arn] == nil {
		s.stalled[arn] = make(chan struct{})
	}
}

// release lets the stalled calls for arn (and the following ones) answer.
func (s *secretStore) release(arn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.stalled[arn]; ch != nil {
		close(ch)
		delete(s.stalled, arn)
	}
}

func (s *secretStore) releaseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for arn, ch := range s.stalled {
		close(ch)
		delete(s.stalled, arn)
	}
}

// abandonedCalls returns how many stalled calls for arn the caller gave up
// (closed the connection) before they were released.
func (s *secretStore) abandonedCalls(arn string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abandoned[arn]
}

// notify wakes waitFor; called with s.mu held.
func (s *secretStore) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitFor waits until cond holds, woken by every call the store receives
// or gives up; it fails t if that takes longer than a minute (a hang, not a
// measurement).
func (s *secretStore) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-guard.C:
			t.Fatalf("Secrets Manager stand-in: still waiting for %s", what)
		}
	}
}

// pause returns when the store next receives or gives up a call, or after
// d: the pace of a test that polls for a state it has to cause.
func (s *secretStore) pause(d time.Duration) {
	s.mu.Lock()
	changed := s.changed
	s.mu.Unlock()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-changed:
	case <-timer.C:
	}
}

// fetches returns how many GetSecretValue calls asked for arn.
func (s *secretStore) fetches(arn string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[arn]
}

func (s *secretStore) serve(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, typ, msg string) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.Header().Set("X-Amzn-ErrorType", typ)
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"__type": typ, "message": msg})
	}
	violation := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		s.mu.Lock()
		s.violations = append(s.violations, msg)
		s.mu.Unlock()
		fail(http.StatusBadRequest, "InvalidRequestException", msg)
	}
	switch {
	case r.Method != http.MethodPost:
		violation("method %s, want POST", r.Method)
		return
	case r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue":
		violation("X-Amz-Target %q, want secretsmanager.GetSecretValue", r.Header.Get("X-Amz-Target"))
		return
	case r.Header.Get("Content-Type") != "application/x-amz-json-1.1":
		violation("Content-Type %q, want application/x-amz-json-1.1", r.Header.Get("Content-Type"))
		return
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential="+fakeAccessKey+"/"):
		// The SDK signs with the function's credentials (the fake ones
		// from its environment); an unsigned request means it found none.
		violation("Authorization %q: not SigV4-signed with the function's credentials", r.Header.Get("Authorization"))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		violation("reading body: %v", err)
		return
	}
	var in struct {
		SecretID string `json:"SecretId"`
	}
	if err := json.Unmarshal(body, &in); err != nil || in.SecretID == "" {
		violation("body %q: want {\"SecretId\": ...}", body)
		return
	}
	s.mu.Lock()
	s.calls[in.SecretID]++
	s.notify()
	stalled := s.stalled[in.SecretID]
	s.mu.Unlock()
	if stalled != nil {
		select {
		case <-stalled:
		case <-r.Context().Done():
			// The client closed the connection: it abandoned the call.
			s.mu.Lock()
			s.abandoned[in.SecretID]++
			s.notify()
			s.mu.Unlock()
			return
		}
	}
	s.mu.Lock()
	value, ok := s.values[in.SecretID]
	version := s.versions[in.SecretID]
	s.mu.Unlock()
	if !ok {
		fail(http.StatusBadRequest, "ResourceNotFoundException", "Secrets Manager can't find the specified secret.")
		return
	}
	name := in.SecretID
	if _, after, ok := strings.Cut(in.SecretID, ":secret:"); ok {
		name = after
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"ARN":           in.SecretID,
		"Name":          name,
		"SecretString":  value,
		"VersionId":     fmt.Sprintf("00000000-0000-4000-8000-%012d", version),
		"VersionStages": []string{"AWSCURRENT"},
		"CreatedDate":   float64(time.Now().Unix()),
	})
}
