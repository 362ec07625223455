// Package fakeapi is a stand-in for Stripe's Events API (GET /v1/events) for
// tests: an httptest server that answers as Stripe documents it
// (https://docs.stripe.com/api/events/list, https://docs.stripe.com/api/pagination):
// events newest first (created descending; events of the same second in a
// fixed order), limit 1 to 100 (default 10), starting_after and
// ending_before cursors (an unknown cursor is a 400 resource_missing),
// created[gt|gte|lt|lte] and created=<exact>, type (with * wildcards) or
// types[] (at most 20, not both), a bearer key (401 otherwise), and the list
// object {"object":"list","url":"/v1/events","has_more":…,"data":[…]}.
//
// Tests script misbehaviour: answers of a given status (429 with
// Retry-After and Stripe-Rate-Limited-Reason, 5xx) before or at a given
// request, events that become visible only later (a gap Stripe fills), and
// a rolled key (SetKey: the old one gets 401). A cursor need not match the
// filters (the reconciler pages a window with ending_before its last stored
// event).
package fakeapi

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Key is the API key the server accepts unless New is given another.
const Key = "rk_test_fake"

// Failure is one scripted error answer.
type Failure struct {
	Status  int               // 429, 500, 503, ...
	Headers map[string]string // e.g. Retry-After, Stripe-Rate-Limited-Reason
}

type event struct {
	id      string
	typ     string
	created int64
	seq     int // insertion order: the tie-break among events of one second
	raw     json.RawMessage
}

// Server is the fake Events API.
type Server struct {
	*httptest.Server
	key string

	mu       sync.Mutex
	events   []event
	seq      int
	failures []Failure // answered in order, one per request, before any success
	failAt   map[int]Failure
	requests []url.Values
}

// New starts a server that accepts key ("" means Key).
func New(key string) *Server {
	if key == "" {
		key = Key
	}
	s := &Server{key: key, failAt: map[int]Failure{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Add makes events visible on the list. Each must be a JSON object with id,
// type and created.
func (s *Server) Add(raws ...[]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, raw := range raws {
		var head struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Created int64  `json:"created"`
		}
		if err := json.Unmarshal(raw, &head); err != nil || head.ID == "" || head.Type == "" {
			panic(fmt.Sprintf("fakeapi: not an event: %s", raw))
		}
		s.seq++
		s.events = append(s.events, event{id: head.ID, typ: head.Type, created: head.Created, seq: s.seq, raw: raw})
	}
	// Newest first; in one second, the later-added first (Stripe's order
	// within a second is its own; any fixed order will do).
	slices.SortFunc(s.events, func(a, b event) int {
		if c := cmp.Compare(b.created, a.created); c != 0 {
			return c
		}
		return cmp.Compare(b.seq, a.seq)
	})
}

// SetKey makes the server accept key instead of the one it accepted (an
// operator rolled the restricted key): requests with the old key get 401.
func (s *Server) SetKey(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = key
}

// FailNext answers the next requests with fs, one each, in order.
func (s *Server) FailNext(fs ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, fs...)
}

// FailRequest answers the n-th request (1-based, counting every request
// the server has received) with f.
func (s *Server) FailRequest(n int, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failAt[n] = f
}

// Requests returns the query of every request received, in order.
func (s *Server) Requests() []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": e})
}

var typesKey = regexp.MustCompile(`^types\[\d*\]$`)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := r.URL.Query()
	s.requests = append(s.requests, q)
	n := len(s.requests)
	w.Header().Set("Request-Id", "req_fake_"+strconv.Itoa(n))

	f, scripted := s.failAt[n]
	if !scripted && len(s.failures) > 0 {
		f, s.failures, scripted = s.failures[0], s.failures[1:], true
	}
	if scripted {
		for k, v := range f.Headers {
			w.Header().Set(k, v)
		}
		if f.Status == http.StatusTooManyRequests {
			writeError(w, f.Status, "invalid_request_error", "rate_limit", "Too many requests hit the API too quickly.")
		} else {
			writeError(w, f.Status, "api_error", "", "An unknown error occurred.")
		}
		return
	}

	if r.Header.Get("Authorization") != "Bearer "+s.key {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "", "Invalid API Key provided.")
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != "/v1/events" {
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+").")
		return
	}

	limit := 10
	if v := q.Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l < 1 || l > 100 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", "Invalid integer: limit must be between 1 and 100")
			return
		}
		limit = l
	}
	var types []string
	for k, vs := range q {
		if typesKey.MatchString(k) {
			types = append(types, vs...)
		}
	}
	if len(types) > 20 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "types: at most 20 event types")
		return
	}
	typ := q.Get("type")
	if typ != "" && len(types) > 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "You may pass either type or types, but not both.")
		return
	}
	bounds := map[string]int64{}
	for _, op := range []string{"gt", "gte", "lt", "lte"} {
		if v := q.Get("created[" + op + "]"); v != "" {
			t, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", "Invalid integer: created["+op+"]")
				return
			}
			bounds[op] = t
		}
	}
	if v := q.Get("created"); v != "" {
		t, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", "Invalid integer: created")
			return
		}
		bounds["gte"], bounds["lte"] = t, t
	}
	match := func(e event) bool {
		if v, ok := bounds["gt"]; ok && e.created <= v {
			return false
		}
		if v, ok := bounds["gte"]; ok && e.created < v {
			return false
		}
		if v, ok := bounds["lt"]; ok && e.created >= v {
			return false
		}
		if v, ok := bounds["lte"]; ok && e.created > v {
			return false
		}
		if len(types) > 0 && !slices.Contains(types, e.typ) {
			return false
		}
		if typ != "" {
			if ok, _ := path.Match(strings.ReplaceAll(typ, ".", "\x00"), strings.ReplaceAll(e.typ, ".", "\x00")); !ok {
				return false
			}
		}
		return true
	}
	var list []event
	for _, e := range s.events {
		if match(e) {
			list = append(list, e)
		}
	}

	after, before := q.Get("starting_after"), q.Get("ending_before")
	if after != "" && before != "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "You may only specify one of these parameters: starting_after, ending_before.")
		return
	}
	var page []event
	var hasMore bool
	switch {
	case after != "":
		i := slices.IndexFunc(s.events, func(e event) bool { return e.id == after })
		if i < 0 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "resource_missing", "No such event: '"+after+"'")
			return
		}
		cursor := s.events[i]
		rest := slices.DeleteFunc(list, func(e event) bool { return !olderThan(e, cursor) })
		page, hasMore = rest[:min(limit, len(rest))], len(rest) > limit
	case before != "":
		i := slices.IndexFunc(s.events, func(e event) bool { return e.id == before })
		if i < 0 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "resource_missing", "No such event: '"+before+"'")
			return
		}
		cursor := s.events[i]
		newer := slices.DeleteFunc(list, func(e event) bool { return !olderThan(cursor, e) })
		// The page nearest the cursor, still newest first.
		from := max(0, len(newer)-limit)
		page, hasMore = newer[from:], from > 0
	default:
		page, hasMore = list[:min(limit, len(list))], len(list) > limit
	}
	data := make([]json.RawMessage, len(page))
	for i, e := range page {
		data[i] = e.raw
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": "/v1/events", "has_more": hasMore, "data": data})
}

// olderThan reports whether a comes after b in the list's order.
func olderThan(a, b event) bool {
	if a.created != b.created {
		return a.created < b.created
	}
	return a.seq < b.seq
}
