package handlers

import (
	"context"
	"fmt"
)

// UnresolvedAnomalies counts anomalies no operator has resolved yet.
func UnresolvedAnomalies(ctx context.Context, db DB) (int, error) {
	var n int
	if err := db.QueryRow(ctx, countUnresolvedAnomalies).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting anomalies: %w", err)
	}
	return n, nil
}
