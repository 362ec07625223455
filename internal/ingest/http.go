package ingest

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// HTTPHandler is the local runner's POST /_eventbridge: the JSON
// EventBridge hands a target, through the same Ingest as the ingest
// function. It answers 200 {"outcome":"stored"|"duplicate"} once the
// receipt has committed, 400 {"error":...,"reason":...} for a permanent
// refusal (the message says what is wrong), and 503 for a transient
// failure (retry). Other tools rely on this contract.
func HTTPHandler(h *Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			answer(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed: POST only"})
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxEnvelopeBytes+1))
		if err != nil {
			answer(w, http.StatusBadRequest, map[string]string{"error": "cannot read body"})
			return
		}
		res, err := h.Ingest(r.Context(), body)
		var refusal *Refusal
		switch {
		case errors.As(err, &refusal):
			answer(w, http.StatusBadRequest, map[string]string{"error": refusal.Message, "reason": refusal.Reason})
		case err != nil:
			// Internal error text stays in the log.
			answer(w, http.StatusServiceUnavailable, map[string]string{"error": "receipt not stored; retry"})
		default:
			if res.Outcome == Stored {
				h.wake(r.Context())
			}
			answer(w, http.StatusOK, map[string]string{"outcome": string(res.Outcome)})
		}
	})
}

func answer(w http.ResponseWriter, status int, body map[string]string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
