package handlers

import (
	"encoding/json"
	"testing"
)

// TestHandWrittenAnswersAreWhatJSONMarshalWrites compares the hot path's
// hand-written answers with encoding/json's, byte for byte (for values
// without '<', '>' or '&', which json.Marshal escapes and both decode the
// same).
func TestHandWrittenAnswersAreWhatJSONMarshalWrites(t *testing.T) {
	check := func(v any, got []byte) {
		t.Helper()
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
	check(issueResponse{Token: "eyJ.a.b", ID: "123", Purpose: "checkout", ExpiresAt: "2026-11-28T10:00:00Z", ExpiresIn: 300},
		issueResponse{Token: "eyJ.a.b", ID: "123", Purpose: "checkout", ExpiresAt: "2026-11-28T10:00:00Z", ExpiresIn: 300}.appendJSON(nil))
	for _, r := range []redeemResponse{
		{Status: "redeemed", ID: "1", Purpose: "p", Subject: ""},
		{Status: "redeemed", ID: "1", Purpose: "p", Subject: `user "7" \ é`, Lease: "abc", LeaseExpiresAt: "2026-11-28T10:00:00Z"},
		{},
	} {
		check(r, r.appendJSON(nil))
	}
}
