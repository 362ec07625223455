package handlers

import (
	"context"
	"encoding/json"
	"fmt"
)

// EventGenerationFailureResolved is the thin event Stripe sends when it
// failed to create events, which will never appear in /v1/events nor be
// delivered (https://docs.stripe.com/api/v2/core/events/event-types,
// v2.core.health.event_generation_failure.resolved; stripe-java's
// V2CoreHealthEventGenerationFailureResolvedEvent: data.alert_id,
// data.summary, data.impact.related_object). Thin events come from a thin
// event destination, by the webhook or by EventBridge (internal/ingest).
const EventGenerationFailureResolved = "v2.core.health.event_generation_failure.resolved"

// AnomalyEventGenerationFailure is the anomaly it raises: the events Stripe
// failed to create are lost to this inbox, and an operator must look at
// the object named in the anomaly (docs/operations.md, the runbook).
const AnomalyEventGenerationFailure = "event_generation_failure"

// thinEvent is what a thin notification carries (stripe-go's ThinEvent).
// Its data is fetched from Stripe with GET /v2/core/events/:id; a
// handler makes no calls, so it reads data only when the payload has it.
type thinEvent struct {
	ID            string         `json:"id"`
	Object        string         `json:"object"`
	RelatedObject *relatedObject `json:"related_object"`
	Data          *struct {
		AlertID string `json:"alert_id"`
		Summary string `json:"summary"`
		Impact  *struct {
			RelatedObject *relatedObject `json:"related_object"`
		} `json:"impact"`
	} `json:"data"`
}

type relatedObject struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	URL  string `json:"url"`
}

// eventGenerationFailureResolved raises one anomaly per related object (or,
// when the notification names none, per event): nothing is booked, an
// operator reconciles the object by hand.
func eventGenerationFailureResolved(ctx context.Context, tx DB, ev Event) (Result, error) {
	var te thinEvent
	if err := json.Unmarshal(ev.Payload, &te); err != nil {
		return Result{}, fmt.Errorf("%w: %s: %v", ErrBadPayload, ev.Type, err)
	}
	related := te.RelatedObject
	detail := map[string]any{"event_type": ev.Type, "event_id": ev.ID}
	if te.Data != nil {
		detail["alert_id"], detail["summary"] = te.Data.AlertID, te.Data.Summary
		if related == nil && te.Data.Impact != nil {
			related = te.Data.Impact.RelatedObject
		}
	}
	subject := ev.ID
	if related != nil && related.ID != "" {
		subject = related.ID
		detail["related_object"] = related
	} else {
		detail["related_object"] = nil
		detail["fetch"] = "GET /v2/core/events/" + ev.ID + " names the impacted object (data.impact.related_object)"
	}
	b, err := json.Marshal(detail)
	if err != nil {
		return Result{}, err
	}
	if _, err := tx.Exec(ctx, raiseAnomaly, AnomalyEventGenerationFailure, subject, ev.Endpoint, ev.ID, string(b), account(ev)); err != nil {
		return Result{}, fmt.Errorf("recording anomaly for %s: %w", subject, err)
	}
	return Result{Outcome: Applied, Anomaly: true}, nil
}
