// Package sqstest is a stand-in for Amazon SQS, for tests and the e2e suite:
// an HTTP server speaking SQS's AWS JSON 1.0 protocol (POST /, X-Amz-Target:
// AmazonSQS.<Operation>, Content-Type application/x-amz-json-1.0), reached
// with the real SDK through its endpoint setting (sqs.Options.BaseEndpoint,
// or AWS_ENDPOINT_URL_SQS). It serves what the ingest function uses
// (ReceiveMessage, DeleteMessage, SendMessage) with SQS's semantics: a
// received message is invisible until it is deleted or its visibility
// timeout passes (Expire stands in for the time passing, so tests never
// sleep), ApproximateReceiveCount counts receives, a queue with a redrive
// policy moves a message to its dead-letter queue once it has been received
// maxReceiveCount times
// (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-dead-letter-queues.html),
// and every body carries its MD5 (the SDK checks it).
//
// The wire format is the SDK's (aws-sdk-go-v2/service/sqs v1.53.0): an
// error is a non-2xx status with {"__type": "com.amazonaws.sqs#Code",
// "message": text}.
package sqstest

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// Message is a message on a queue.
type Message struct {
	ID         string
	Body       string
	Attributes map[string]string // message attributes (String values)
	Receives   int
	inFlight   bool
	handle     string
}

type queue struct {
	messages    []*Message
	deadLetter  string // queue name, "" for none
	maxReceives int
}

// Server is the stand-in. Queue URLs are <URL>/<Account>/<name>.
type Server struct {
	*httptest.Server
	Account string

	mu      sync.Mutex
	queues  map[string]*queue
	seq     int
	calls   map[string]int
	failing map[string]int // operation → calls left to fail with 500
}

// New starts a stand-in with no queues.
func New() *Server {
	s := &Server{Account: "123456789012", queues: map[string]*queue{}, calls: map[string]int{}, failing: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// CreateQueue makes a queue and returns its URL. With deadLetter set,
// messages received maxReceives times move there (the redrive policy).
func (s *Server) CreateQueue(name, deadLetter string, maxReceives int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues[name] = &queue{deadLetter: deadLetter, maxReceives: maxReceives}
	return s.QueueURL(name)
}

// QueueURL is name's URL.
func (s *Server) QueueURL(name string) string { return s.URL + "/" + s.Account + "/" + name }

// Send puts a message on a queue, as EventBridge's rule target does.
func (s *Server) Send(name, body string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.send(s.queues[name], body, nil)
}

func (s *Server) send(q *queue, body string, attrs map[string]string) string {
	s.seq++
	m := &Message{ID: fmt.Sprintf("msg-%06d", s.seq), Body: body, Attributes: attrs}
	q.messages = append(q.messages, m)
	return m.ID
}

// Messages returns copies of the messages on a queue, in flight or not.
func (s *Server) Messages(name string) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Message
	for _, m := range s.queues[name].messages {
		out = append(out, *m)
	}
	return out
}

// Expire ends every visibility timeout: messages received and not deleted
// become visible again (or, past maxReceives, move to the dead-letter
// queue when next received).
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.queues {
		for _, m := range q.messages {
			m.inFlight = false
		}
	}
}

// Fail makes the next n calls of operation (e.g. "DeleteMessage") fail
// with a 500.
func (s *Server) Fail(operation string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[operation] = n
}

// Calls counts the calls of operation.
func (s *Server) Calls(operation string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[operation]
}

type attrValue struct {
	DataType    string `json:"DataType"`
	StringValue string `json:"StringValue,omitempty"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
	if r.Method != http.MethodPost || !ok || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-amz-json-1.0") {
		fail(w, http.StatusBadRequest, "InvalidAction", "not an SQS JSON request")
		return
	}
	if !strings.Contains(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256") {
		fail(w, http.StatusForbidden, "MissingAuthenticationToken", "request is not signed")
		return
	}
	var in struct {
		QueueURL            string               `json:"QueueUrl"`
		MaxNumberOfMessages int                  `json:"MaxNumberOfMessages"`
		ReceiptHandle       string               `json:"ReceiptHandle"`
		MessageBody         string               `json:"MessageBody"`
		MessageAttributes   map[string]attrValue `json:"MessageAttributes"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		fail(w, http.StatusBadRequest, "InvalidParameterValue", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[op]++
	if s.failing[op] > 0 {
		s.failing[op]--
		fail(w, http.StatusInternalServerError, "InternalError", "scripted failure")
		return
	}
	name := in.QueueURL[strings.LastIndex(in.QueueURL, "/")+1:]
	q := s.queues[name]
	if q == nil || in.QueueURL != s.QueueURL(name) {
		fail(w, http.StatusBadRequest, "QueueDoesNotExist", "The specified queue does not exist.")
		return
	}
	switch op {
	case "SendMessage":
		if in.MessageBody == "" {
			fail(w, http.StatusBadRequest, "InvalidParameterValue", "MessageBody is required")
			return
		}
		attrs := map[string]string{}
		for k, v := range in.MessageAttributes {
			attrs[k] = v.StringValue
		}
		id := s.send(q, in.MessageBody, attrs)
		ok200(w, map[string]any{"MessageId": id, "MD5OfMessageBody": md5hex(in.MessageBody)})
	case "ReceiveMessage":
		n := in.MaxNumberOfMessages
		if n == 0 {
			n = 1
		}
		if n < 1 || n > 10 {
			fail(w, http.StatusBadRequest, "InvalidParameterValue", "MaxNumberOfMessages must be 1 to 10")
			return
		}
		out := []map[string]any{}
		var kept []*Message
		for _, m := range q.messages {
			if !m.inFlight && len(out) < n && q.deadLetter != "" && m.Receives >= q.maxReceives {
				// The redrive policy: received maxReceiveCount times.
				dl := s.queues[q.deadLetter]
				m.handle = ""
				dl.messages = append(dl.messages, m)
				continue
			}
			kept = append(kept, m)
			if m.inFlight || len(out) >= n {
				continue
			}
			m.inFlight = true
			m.Receives++
			s.seq++
			m.handle = fmt.Sprintf("%s#%d", m.ID, s.seq)
			out = append(out, map[string]any{
				"MessageId": m.ID, "ReceiptHandle": m.handle, "Body": m.Body, "MD5OfBody": md5hex(m.Body),
				"Attributes": map[string]string{"ApproximateReceiveCount": strconv.Itoa(m.Receives)},
			})
		}
		q.messages = kept
		ok200(w, map[string]any{"Messages": out})
	case "DeleteMessage":
		for i, m := range q.messages {
			if m.handle != "" && m.handle == in.ReceiptHandle {
				q.messages = append(q.messages[:i], q.messages[i+1:]...)
				break
			}
		}
		// SQS answers success for a handle it no longer knows, too.
		ok200(w, map[string]any{})
	default:
		fail(w, http.StatusBadRequest, "InvalidAction", "the stand-in does not serve "+op)
	}
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func ok200(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("x-amzn-query-error", "AWS.SimpleQueueService."+code+";Sender")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + code, "message": msg})
}

// Client is the real SDK client, pointed at the stand-in through its
// endpoint setting (BaseEndpoint, what AWS_ENDPOINT_URL_SQS sets). Not
// dual-stack: the SDK's endpoint rules refuse dual-stack with a custom
// endpoint ("Dualstack and custom endpoint are not supported"), so the
// ingest function turns dual-stack on only without one (bootstrap).
// Retries are off: a scripted failure reaches the caller.
func (s *Server) Client() *sqs.Client {
	return sqs.New(sqs.Options{
		Region:           "eu-west-1",
		BaseEndpoint:     aws.String(s.URL),
		RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDSQSTEST", SecretAccessKey: "sqstest-secret", Source: "sqstest"}, nil
		}),
	})
}
