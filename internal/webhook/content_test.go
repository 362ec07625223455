package webhook_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/handlers"
	"github.com/stripe-inbox/inbox/internal/worker"
)

// invoicePaidWithText is an invoice.paid event whose customer-written fields
// carry text, spelled as it appears in the JSON (escapes included).
func invoicePaidWithText(id, invoice, jsonText string) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"object":"event","api_version":"2025-03-31.basil","created":1764633600,"livemode":false,"type":"invoice.paid",`+
		`"data":{"object":{"id":%q,"object":"invoice","customer":"cus_1","customer_name":"%s","description":"%s","status":"paid","currency":"usd","amount_due":1000,"amount_paid":1000}}}`,
		id, invoice, jsonText, jsonText))
}

// contentCases are verified events whose text PostgreSQL's jsonb refuses,
// though it is valid JSON that Go decodes. Each must be stored (200) and
// processed with the exact bytes.
var contentCases = []struct {
	name string
	body []byte
}{
	{"escaped NUL in customer text", invoicePaidWithText("evt_nul", "in_nul", `Ann\u0000Lee`)},
	{"lone high surrogate", invoicePaidWithText("evt_hi", "in_hi", `emoji cut \ud83d here`)},
	{"lone low surrogate", invoicePaidWithText("evt_lo", "in_lo", `\ude00`)},
	{"low then high surrogate", invoicePaidWithText("evt_lohi", "in_lohi", `\udc00\ud800`)},
	{"high surrogate at the end of a string", invoicePaidWithText("evt_hiend", "in_hiend", `x\ud800`)},
	{"bytes that are not UTF-8", invoicePaidWithText("evt_utf8", "in_utf8", "caf\xe9")},
	{"number beyond numeric's range", []byte(`{"id":"evt_num","object":"event","type":"invoice.paid","created":1764633600,"livemode":false,"x":1e-20000,` +
		`"data":{"object":{"id":"in_num","object":"invoice","customer":"cus_1","status":"paid","currency":"usd","amount_due":1000,"amount_paid":1000}}}`)},
}

// TestContentJSONBRefusesIsStoredAndProcessedWithTheExactBytes: a verified
// event is never refused (4xx) or failed (5xx) for its content. Text that
// jsonb cannot hold is stored with its exact bytes, answered 200, answered
// duplicate on a redelivery, and the worker's handler gets the exact bytes,
// through the single-receipt path (BatchSize 1, inbox.Lock) and the batch
// path (inbox.LockMany).
func TestContentJSONBRefusesIsStoredAndProcessedWithTheExactBytes(t *testing.T) {
	t.Parallel()
	for _, batchSize := range []int{1, 50} {
		t.Run(fmt.Sprintf("batch size %d", batchSize), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, c := range contentCases {
				var ev struct{ ID string }
				require.NoError(t, json.Unmarshal(c.body, &ev), "%s: Go decodes it", c.name)
				req := request("billing", c.body, sign(c.body, secretA))
				if c.name == "bytes that are not UTF-8" {
					// What a Function URL does with a body that is not text.
					req.Body, req.IsBase64Encoded = base64.StdEncoding.EncodeToString(c.body), true
				}
				resp := b.do(t, req)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", c.name, resp.Body)
				require.Equal(t, "stored", outcomeOf(t, resp), c.name)
				resp = b.do(t, request("billing", c.body, sign(c.body, secretA)))
				require.Equal(t, "duplicate", outcomeOf(t, resp), c.name)

				var raw []byte
				var id string
				require.NoError(t, b.db.Pool.QueryRow(context.Background(),
					`SELECT payload_raw, payload->>'id' FROM webhook_inbox WHERE event_id = $1`, ev.ID).Scan(&raw, &id))
				require.Equal(t, c.body, raw, "%s: payload_raw holds the exact bytes", c.name)
				require.Equal(t, ev.ID, id, "%s: payload stays a queryable jsonb rendering", c.name)
				if c.name != "number beyond numeric's range" {
					// The lossy rendering keeps every field but the refused text.
					require.Equal(t, 1, b.db.Count(t, "webhook_inbox", `event_id = $1 AND payload #>> '{data,object,amount_paid}' = '1000'`, ev.ID), c.name)
				} else {
					require.Equal(t, 1, b.db.Count(t, "webhook_inbox", `event_id = $1 AND payload->'inbox_payload_raw_only' = 'true'`, ev.ID), c.name)
				}
			}
			// Text jsonb holds keeps payload_raw NULL: a valid surrogate pair,
			// an escaped backslash before "u0000", UTF-8, other escapes.
			for i, text := range []string{`\ud83d\ude00 ok`, `C:\\u0000`, "café ☕", `\"quoted\" \\ \/ \n\t`, `\u00e9\uFFFD`} {
				id := fmt.Sprintf("evt_plain_%d", i)
				body := invoicePaidWithText(id, "in_"+id, text)
				resp := b.do(t, request("billing", body, sign(body, secretA)))
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", text, resp.Body)
				require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = $1 AND payload_raw IS NULL", id), text)
			}

			var mu sync.Mutex
			got := map[string][]byte{}
			reg := handlers.Default()
			paid := reg["invoice.paid"]
			reg["invoice.paid"] = handlers.HandlerFunc(func(ctx context.Context, tx handlers.DB, ev handlers.Event) (handlers.Result, error) {
				mu.Lock()
				got[ev.ID] = ev.Payload
				mu.Unlock()
				return paid(ev)(ctx, tx)
			})
			cfg := worker.Config{Mode: worker.ModeTest, Concurrency: 1, BatchSize: batchSize, DeadlineMargin: 6 * time.Second, StatementTimeout: time.Second, Lease: time.Minute}.WithDefaults()
			require.NoError(t, cfg.Validate())
			w, err := worker.New(b.db.Pool, reg, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
			require.NoError(t, err)
			_, err = w.Run(context.Background())
			require.NoError(t, err)

			for _, c := range contentCases {
				var ev struct {
					ID   string
					Data struct{ Object struct{ ID string } }
				}
				require.NoError(t, json.Unmarshal(c.body, &ev))
				require.Equal(t, c.body, got[ev.ID], "%s: the handler got the exact bytes", c.name)
				require.Equal(t, 1, b.db.Count(t, "webhook_inbox", "event_id = $1 AND outcome = 'applied'", ev.ID), c.name)
				require.Equal(t, 1, b.db.Count(t, "invoices", "id = $1 AND status = 'paid'", ev.Data.Object.ID), c.name)
			}
		})
	}
}
