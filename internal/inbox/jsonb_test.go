package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stripe-inbox/inbox/internal/pgtest"
)

// FuzzJSONBText checks jsonbText against PostgreSQL itself: for any valid
// JSON, it changes nothing that jsonb accepts, and what it returns jsonb
// accepts (but for numbers beyond numeric's range, which Store stores with
// a marker).
//
//	go test ./internal/inbox -run '^$' -fuzz FuzzJSONBText -fuzztime 60s
func FuzzJSONBText(f *testing.F) {
	db := pgtest.DB(f)
	for _, seed := range []string{
		`{"a":"b"}`, `{"a":"\u0000"}`, `{"a":"\ud800"}`, `{"a":"\udc00"}`, `{"a":"\ud800\u0041"}`,
		`{"a":"\ud83d\ude00"}`, `{"a":"\\u0000"}`, `{"a":"\\\u0000"}`, "{\"a\":\"caf\xe9\"}", `["\uD800\uDC00", "\uDBFF"]`,
		`{"\u0000":1}`, `"x\ud800"`, `{"a":1e-20000}`, "{\"a\":\"\xed\xa0\x80\"}", `{"a":"\u00e9 \/ \" \\"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		ctx := context.Background()
		var out bool
		originalErr := db.Pool.QueryRow(ctx, `SELECT $1::text::jsonb IS NOT NULL`, string(body)).Scan(&out)
		repaired, changed := jsonbText(body)
		if !changed {
			require.Equal(t, body, repaired)
		}
		if originalErr == nil {
			require.False(t, changed, "jsonbText changed %q, which jsonb accepts", body)
			return
		}
		var pgErr *pgconn.PgError
		require.True(t, errors.As(originalErr, &pgErr), "%v", originalErr)
		require.True(t, refusedContent(pgErr.Code), "PostgreSQL refused %q with %s, which Store does not treat as content", body, pgErr.Code)
		err := db.Pool.QueryRow(ctx, `SELECT $1::text::jsonb IS NOT NULL`, string(repaired)).Scan(&out)
		if err != nil {
			require.True(t, errors.As(err, &pgErr), "%v", err)
			require.Contains(t, []string{"22003", "54001"}, pgErr.Code, "jsonb refused the repaired %q (from %q): %v", repaired, body, err)
		}
	})
}
