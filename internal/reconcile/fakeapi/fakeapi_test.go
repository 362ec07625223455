package fakeapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

type list struct {
	Object  string `json:"object"`
	HasMore bool   `json:"has_more"`
	Data    []struct {
		ID string `json:"id"`
	} `json:"data"`
}

func get(t *testing.T, s *Server, q url.Values) (int, list) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.URL+"/v1/events?"+q.Encode(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+Key)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var l list
	if res.StatusCode == 200 {
		require.NoError(t, json.Unmarshal(body, &l))
	}
	return res.StatusCode, l
}

func ids(l list) []string {
	var out []string
	for _, d := range l.Data {
		out = append(out, d.ID)
	}
	return out
}

// The stand-in pages as Stripe documents: newest first, starting_after
// walks to older events, ending_before to newer ones (the page nearest the
// cursor, still newest first), has_more in the direction of travel.
func TestPaginationBothDirections(t *testing.T) {
	t.Parallel()
	s := New("")
	t.Cleanup(s.Close)
	for i := range 7 {
		s.Add([]byte(fmt.Sprintf(`{"id":"evt_%d","type":"invoice.paid","created":%d}`, i, 1000+i)))
	}
	s.Add([]byte(`{"id":"evt_other","type":"customer.created","created":1003}`))

	q := url.Values{"limit": {"3"}, "types[0]": {"invoice.paid"}}
	_, l := get(t, s, q)
	require.Equal(t, []string{"evt_6", "evt_5", "evt_4"}, ids(l))
	require.True(t, l.HasMore)
	q.Set("starting_after", "evt_4")
	_, l = get(t, s, q)
	require.Equal(t, []string{"evt_3", "evt_2", "evt_1"}, ids(l))
	q.Set("starting_after", "evt_1")
	_, l = get(t, s, q)
	require.Equal(t, []string{"evt_0"}, ids(l))
	require.False(t, l.HasMore)

	q.Del("starting_after")
	q.Set("ending_before", "evt_1")
	_, l = get(t, s, q)
	require.Equal(t, []string{"evt_4", "evt_3", "evt_2"}, ids(l))
	require.True(t, l.HasMore)

	// A cursor outside the created range: the events of the range newer
	// than it.
	_, l = get(t, s, url.Values{"limit": {"2"}, "ending_before": {"evt_1"}, "created[gte]": {"1004"}, "types[0]": {"invoice.paid"}})
	require.Equal(t, []string{"evt_5", "evt_4"}, ids(l))
	require.True(t, l.HasMore)

	_, l = get(t, s, url.Values{"created[gte]": {"1002"}, "created[lt]": {"1004"}, "type": {"invoice.*"}})
	require.Equal(t, []string{"evt_3", "evt_2"}, ids(l))

	s.SetKey("rk_test_rolled")
	status, _ := get(t, s, url.Values{})
	require.Equal(t, 401, status, "the old key after a roll")
	s.SetKey(Key)

	status, _ = get(t, s, url.Values{"limit": {"101"}})
	require.Equal(t, 400, status)
	status, _ = get(t, s, url.Values{"starting_after": {"evt_nope"}})
	require.Equal(t, 400, status)
	status, _ = get(t, s, url.Values{"type": {"a"}, "types[0]": {"b"}})
	require.Equal(t, 400, status)
	many := url.Values{}
	for i := range 21 {
		many.Set(fmt.Sprintf("types[%d]", i), "x")
	}
	status, _ = get(t, s, many)
	require.Equal(t, 400, status)
}
