package webhook

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// FunctionURLMaxPayload is the largest request body a Lambda Function URL
// accepts (6 MB); larger requests never reach the function.
const FunctionURLMaxPayload = 6 * 1000 * 1000

// HTTPHandler serves h over plain HTTP the way a Lambda Function URL would:
// each request is converted to the payload-format-2.0 event the Function URL
// sends, so local runs (and `stripe listen --forward-to`) exercise the same
// code as AWS, including the base64 path for bodies that are not text.
func HTTPHandler(h *Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, FunctionURLMaxPayload+1))
		if err != nil {
			http.Error(w, `{"error":"cannot read body"}`, http.StatusBadRequest)
			return
		}
		if len(body) > FunctionURLMaxPayload {
			// The Function URL itself refuses such a request.
			http.Error(w, `{"error":"request too large"}`, http.StatusRequestEntityTooLarge)
			return
		}
		resp, _ := h.Handle(r.Context(), FunctionURLRequest(r, body))
		for k, v := range resp.Headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.WriteString(w, resp.Body)
	})
}

// FunctionURLRequest builds the event a Function URL would send for r with
// the given body. Header names are lower-cased and repeated headers joined
// with commas, as AWS does; a body that is not text is base64-encoded.
func FunctionURLRequest(r *http.Request, body []byte) events.LambdaFunctionURLRequest {
	headers := make(map[string]string, len(r.Header))
	for k, vs := range r.Header {
		headers[strings.ToLower(k)] = strings.Join(vs, ",")
	}
	now := time.Now()
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	req := events.LambdaFunctionURLRequest{
		Version:        "2.0",
		RawPath:        r.URL.EscapedPath(),
		RawQueryString: r.URL.RawQuery,
		Headers:        headers,
		RequestContext: events.LambdaFunctionURLRequestContext{
			RequestID:  newRequestID(),
			DomainName: r.Host,
			Time:       now.UTC().Format("02/Jan/2006:15:04:05 -0700"),
			TimeEpoch:  now.UnixMilli(),
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{
				Method:    r.Method,
				Path:      r.URL.Path,
				Protocol:  r.Proto,
				SourceIP:  ip,
				UserAgent: r.UserAgent(),
			},
		},
	}
	if isText(r.Header.Get("Content-Type")) {
		req.Body = string(body)
	} else {
		req.Body = base64.StdEncoding.EncodeToString(body)
		req.IsBase64Encoded = true
	}
	return req
}

func isText(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return strings.HasPrefix(mt, "text/") || mt == "application/json" || strings.HasSuffix(mt, "+json")
}

func newRequestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
