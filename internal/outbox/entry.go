package outbox

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
)

// PutEvents limits. AWS documents at most 10 entries per call, and a limit
// on the total size of a call's entries computed as in "Calculating
// PutEvents event entry size"
// (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevents.html#eb-putevent-size):
// 14 bytes for Time when set, plus the UTF-8 bytes of Source, DetailType,
// Detail and each of Resources. The SDK's comment on PutEvents
// (aws-sdk-go-v2/service/eventbridge v1.55.11, api_op_PutEvents.go) now says
// 1 MB; the relay keeps to 256 KB, the limit every region has enforced,
// which stays valid under either.
const (
	MaxEntriesPerCall = 10
	MaxCallBytes      = 256 * 1024
	timeEntryBytes    = 14
)

// Detail is the JSON an entry carries as its detail. outbox_id is the outbox
// row's id: stable across republications (the relay publishes at least
// once), so consumers de-duplicate on it. data is the row's payload as the
// handler wrote it (its schema per event type is in the README).
type Detail struct {
	OutboxID      int64           `json:"outbox_id"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	OccurredAt    time.Time       `json:"occurred_at"`
	Data          json.RawMessage `json:"data"`
}

// row is a claimed outbox row.
type row struct {
	id            int64
	aggregateType string
	aggregateID   string
	eventType     string
	payload       string
	createdAt     time.Time
	attempts      int
}

// entry is the PutEvents entry for r on bus, with source as its Source.
func entry(r row, bus, source string) (types.PutEventsRequestEntry, error) {
	data := json.RawMessage(r.payload)
	if !json.Valid(data) {
		return types.PutEventsRequestEntry{}, fmt.Errorf("outbox row %d: payload is not JSON", r.id)
	}
	detail, err := json.Marshal(Detail{OutboxID: r.id, AggregateType: r.aggregateType, AggregateID: r.aggregateID, OccurredAt: r.createdAt.UTC(), Data: data})
	if err != nil {
		return types.PutEventsRequestEntry{}, fmt.Errorf("outbox row %d: %w", r.id, err)
	}
	return types.PutEventsRequestEntry{
		EventBusName: aws.String(bus),
		Source:       aws.String(source),
		DetailType:   aws.String(r.eventType),
		Detail:       aws.String(string(detail)),
		Time:         aws.Time(r.createdAt),
	}, nil
}

// EntrySize is e's size as AWS counts it against the call's limit (see
// MaxCallBytes).
func EntrySize(e types.PutEventsRequestEntry) int {
	n := 0
	if e.Time != nil {
		n += timeEntryBytes
	}
	n += len(aws.ToString(e.Source)) + len(aws.ToString(e.DetailType)) + len(aws.ToString(e.Detail))
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}

// split groups entries (by index) into calls of at most MaxEntriesPerCall
// entries and MaxCallBytes, in order. Every entry given must fit in a call
// on its own.
func split(sizes []int) [][]int {
	var (
		calls [][]int
		cur   []int
		bytes int
	)
	for i, n := range sizes {
		if len(cur) == MaxEntriesPerCall || (len(cur) > 0 && bytes+n > MaxCallBytes) {
			calls = append(calls, cur)
			cur, bytes = nil, 0
		}
		cur = append(cur, i)
		bytes += n
	}
	if len(cur) > 0 {
		calls = append(calls, cur)
	}
	return calls
}
