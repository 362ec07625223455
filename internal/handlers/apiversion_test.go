package handlers

import (
	"errors"
	"testing"
)

func TestCheckAPIVersion(t *testing.T) {
	t.Parallel()
	for payload, ok := range map[string]bool{
		`{"id":"evt_1"}`:                               true, // none: the endpoint's own (events before 2014-10-31 have null)
		`{"api_version":null}`:                         true,
		`{"api_version":"2017-08-15"}`:                 true,
		`{"api_version":"2024-06-20"}`:                 true,
		`{"api_version":"2024-09-30.acacia"}`:          true,
		`{"api_version":"2025-03-31.basil"}`:           true,
		`{"api_version":"2025-08-27.basil"}`:           true,
		`{"api_version":"2025-09-30.clover"}`:          false,
		`{"api_version":"2026-04-22.dahlia"}`:          false,
		`{"api_version":"2025-01-01"}`:                 false, // after the named releases began, a date alone is not Stripe's
		`{"api_version":"latest"}`:                     false,
		`{"api_version":"2025-03-31.basil; DROP"}`:     false,
		`{"api_version":"2025-03-31.Basil"}`:           false,
		`{"api_version":"2025-03-31.basil.preview"}`:   false,
		`{"api_version":"2025-03-31.basil","id":"x"} `: true,
	} {
		err := checkAPIVersion([]byte(payload))
		if ok != (err == nil) {
			t.Errorf("%s: err %v, want ok=%v", payload, err, ok)
		}
		if err != nil && !errors.Is(err, ErrUnknownAPIVersion) {
			t.Errorf("%s: %v is not ErrUnknownAPIVersion", payload, err)
		}
	}
	if err := checkAPIVersion([]byte(`not json`)); !errors.Is(err, ErrBadPayload) {
		t.Errorf("not JSON: %v", err)
	}
}
