// Package stripeapitest is a stand-in for the part of the Stripe API the
// write-backs call (internal/writeback): POST /v1/customers/{id} (metadata
// only) and GET /v1/customers/{id}, with Stripe's idempotency semantics
// (https://docs.stripe.com/api/idempotent_requests):
//
//   - a POST with an Idempotency-Key the server knows is not executed
//     again: the first result is replayed (with Idempotent-Replayed: true),
//     status and body, whatever the customer looks like now, a failure
//     included: a request that was executed and then failed (ApplyThenFail
//     with a status) saved that status, and its key replays it ("Subsequent
//     requests with the same key return the same result, including 500
//     errors");
//   - a known key with other parameters is refused (400, idempotency_error);
//   - a request that failed before it was executed (a scripted 429 or 5xx
//     answered instead) saves no result under its key ("Results are only
//     saved if an API endpoint started executing");
//   - Forget drops every key, as Stripe may once a key is 24 hours old; a
//     request with a forgotten key runs as a new one.
//
// Tests script misbehaviour with Fail: answer the next requests with a
// status (429 with Retry-After, 5xx) without executing them, or execute a
// request and then fail its answer (ApplyThenFail: a 500, or the connection
// closed with nothing written: the client cannot tell whether it ran).
// Applied counts executions, never replays: a write-back done exactly once
// has Applied 1, however many requests carried its key.
//
// For a process that plays Stripe for many runs (scripts/stripeapistandin,
// the fault suite's), AnyCustomer makes every customer id exist, and
// FailWith draws a misbehaviour for each request no scripted Fault is
// queued for.
//
// It is reached with stripe-go through its backend URL setting
// (stripe.BackendConfig.URL), as the real API is.
package stripeapitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
)

// Key is the API key the server accepts.
const Key = "sk_test_stand_in"

// Fault is one scripted misbehaviour for the next request that matches.
type Fault struct {
	// Method, "" for any.
	Method string
	// Status answered instead of executing (429, 409 idempotency_key_in_use,
	// 500, 503, 400...). With
	// ApplyThenFail: the status answered after executing (0: close the
	// connection with nothing written).
	Status int
	// RetryAfter is the Retry-After header of a 429, in seconds ("" none).
	RetryAfter string
	// ApplyThenFail executes the request and then fails the answer. With a
	// status, that failure is what is saved under the key (Stripe saves the
	// status and body of a request whose execution began, a 500 included);
	// with none (the connection closed), the executed result is.
	ApplyThenFail bool
}

// Request is one request the server received.
type Request struct {
	Method, Path, IdempotencyKey string
	Replayed                     bool // answered from a saved result
	Executed                     bool // changed the customer (or would have, for a GET: false)
}

type saved struct {
	params string
	status int
	body   []byte
}

// Server is the stand-in. Its methods are safe for concurrent use.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	customers map[string]map[string]string // id -> metadata
	keys      map[string]saved
	faults    []Fault
	faultFunc func(method string) (Fault, bool)
	anyCust   bool
	requests  []Request
	applied   map[string]int // idempotency key -> executions
}

// New starts a server with the given customers (ids, no metadata).
func New(customers ...string) *Server {
	s := &Server{customers: map[string]map[string]string{}, keys: map[string]saved{}, applied: map[string]int{}}
	for _, c := range customers {
		s.customers[c] = map[string]string{}
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// AddCustomer creates a customer with metadata.
func (s *Server) AddCustomer(id string, metadata map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]string{}
	for k, v := range metadata {
		m[k] = v
	}
	s.customers[id] = m
}

// Metadata returns a copy of a customer's metadata (nil if absent).
func (s *Server) Metadata(id string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.customers[id]
	if !ok {
		return nil
	}
	out := map[string]string{}
	for k, v := range c {
		out[k] = v
	}
	return out
}

// AnyCustomer makes every customer id exist: one the server has not seen
// exists with no metadata.
func (s *Server) AnyCustomer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.anyCust = true
}

// FailWith sets f to draw a fault for each request no scripted Fault (Fail)
// matches; f returns false for a request served normally. It runs under the
// server's lock: it must not call the server.
func (s *Server) FailWith(f func(method string) (Fault, bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultFunc = f
}

// Fail scripts faults, in order, for the next requests that match.
func (s *Server) Fail(fs ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, fs...)
}

// Forget drops every idempotency key, as Stripe may once a key is 24 hours
// old.
func (s *Server) Forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = map[string]saved{}
}

// Applied is how many times a POST with the key was executed.
func (s *Server) Applied(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[key]
}

// AppliedTotal is how many POSTs were executed.
func (s *Server) AppliedTotal() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.applied {
		n += v
	}
	return n
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ServeHTTP serves the API: a test may put it behind a server of its own
// (to act between the execution and the answer).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.serve(w, r) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key")}
	defer func() { s.requests = append(s.requests, req) }()
	w.Header().Set("Request-Id", fmt.Sprintf("req_standin_%d", len(s.requests)+1))

	if r.Header.Get("Authorization") != "Bearer "+Key {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "", "Invalid API Key provided")
		return
	}
	id, ok := strings.CutPrefix(r.URL.Path, "/v1/customers/")
	if !ok || id == "" || strings.Contains(id, "/") {
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+")")
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", err.Error())
		return
	}
	if _, ok := s.customers[id]; !ok && s.anyCust {
		s.customers[id] = map[string]string{}
	}
	fault, faulted := s.nextFault(r.Method)
	if faulted && !fault.ApplyThenFail {
		if fault.RetryAfter != "" {
			w.Header().Set("Retry-After", fault.RetryAfter)
		}
		if fault.Status == http.StatusTooManyRequests {
			w.Header().Set("Stripe-Rate-Limited-Reason", "global-rate")
			writeError(w, fault.Status, "invalid_request_error", "rate_limit", "Too many requests hit the API too quickly.")
			return
		}
		if fault.Status == http.StatusConflict {
			// A concurrent request with the key is running: nothing saved
			// under it ("If incoming parameters fail validation, or the
			// request conflicts with another request that's executing
			// concurrently, we don't save the idempotent result",
			// https://docs.stripe.com/api/idempotent_requests).
			writeError(w, fault.Status, "invalid_request_error", "idempotency_key_in_use",
				"There is currently another in-progress request using this Idempotent Key. Please try again later.")
			return
		}
		writeError(w, fault.Status, "api_error", "", "scripted failure")
		return
	}
	switch r.Method {
	case http.MethodGet:
		c, ok := s.customers[id]
		if !ok {
			writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "No such customer: '"+id+"'")
			return
		}
		writeJSON(w, http.StatusOK, customerJSON(id, c))
	case http.MethodPost:
		params := r.PostForm.Encode() // sorted by key: the same parameters encode the same
		if req.IdempotencyKey != "" {
			if sv, ok := s.keys[req.IdempotencyKey]; ok {
				if sv.params != params {
					writeError(w, http.StatusBadRequest, "idempotency_error", "", "Keys for idempotent requests can only be used with the same parameters they were first used with.")
					return
				}
				req.Replayed = true
				w.Header().Set("Idempotent-Replayed", "true")
				if faulted && fault.Status != 0 {
					// Nothing runs again: the saved result is the answer.
					faulted = false
				}
				s.finish(w, fault, faulted, sv.status, sv.body)
				return
			}
		}
		status, body := s.update(id, r.PostForm)
		req.Executed = status == http.StatusOK
		if req.IdempotencyKey != "" {
			sv := saved{params: params, status: status, body: body}
			if faulted && fault.Status != 0 {
				sv.status, sv.body = errorBody(fault.Status, "api_error", "", "scripted failure after the request was executed")
			}
			s.keys[req.IdempotencyKey] = sv
			if req.Executed {
				s.applied[req.IdempotencyKey]++
			}
		}
		s.finish(w, fault, faulted, status, body)
	default:
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "method not allowed")
	}
}

// finish writes the answer, or fails it after the request was executed.
func (s *Server) finish(w http.ResponseWriter, f Fault, faulted bool, status int, body []byte) {
	if !faulted {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return
	}
	if f.Status != 0 {
		writeError(w, f.Status, "api_error", "", "scripted failure after the request was executed")
		return
	}
	// Close the connection with nothing written: to the client, a reset.
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (s *Server) nextFault(method string) (Fault, bool) {
	for i, f := range s.faults {
		if f.Method == "" || f.Method == method {
			s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			return f, true
		}
	}
	if s.faultFunc != nil {
		return s.faultFunc(method)
	}
	return Fault{}, false
}

// update applies POST /v1/customers/{id}: only metadata[...] parameters
// (an empty value removes the key, as Stripe's "unset" does).
func (s *Server) update(id string, form url.Values) (int, []byte) {
	c, ok := s.customers[id]
	if !ok {
		return errorBody(http.StatusNotFound, "invalid_request_error", "resource_missing", "No such customer: '"+id+"'")
	}
	for k := range form {
		if _, ok := metadataKey(k); !ok {
			return errorBody(http.StatusBadRequest, "invalid_request_error", "parameter_unknown", "Received unknown parameter: "+k)
		}
	}
	for k, vs := range form {
		mk, _ := metadataKey(k)
		if v := vs[len(vs)-1]; v == "" {
			delete(c, mk)
		} else {
			c[mk] = v
		}
	}
	b, _ := json.Marshal(customerJSON(id, c))
	return http.StatusOK, b
}

func metadataKey(param string) (string, bool) {
	rest, ok := strings.CutPrefix(param, "metadata[")
	if !ok || !strings.HasSuffix(rest, "]") || len(rest) < 2 {
		return "", false
	}
	return strings.TrimSuffix(rest, "]"), true
}

// customerJSON: a customer as Stripe answers it, personal data included
// (what the sender must not keep).
func customerJSON(id string, metadata map[string]string) map[string]any {
	return map[string]any{"id": id, "object": "customer", "metadata": metadata, "livemode": false,
		"email": id + "@example.com", "name": "Jenny Rosen",
		"address": map[string]any{"line1": "1 Main St", "city": "Springfield", "postal_code": "12345", "country": "US"}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func errorBody(status int, typ, code, msg string) (int, []byte) {
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return status, b
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	st, b := errorBody(status, typ, code, msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	_, _ = w.Write(b)
}

// String describes the server's state, for test failures.
func (s *Server) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("stripeapitest: %d requests, applied %v", len(s.requests), s.applied)
}
