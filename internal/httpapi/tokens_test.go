package httpapi

import (
	"net/http/httptest"
	"testing"
)

// A bearer credential's scheme is read whatever its case (RFC 9110: "bearer
// KEY" was a 401); the secret is compared exactly.
func TestMatchBearer(t *testing.T) {
	toks := []Token{{Name: "ops", Secret: "0123456789abcdef"}}
	for _, c := range []struct {
		header, want string
	}{
		{"Bearer 0123456789abcdef", "ops"},
		{"bearer 0123456789abcdef", "ops"},
		{"BEARER  0123456789abcdef", "ops"},
		{"Bearer 0123456789ABCDEF", ""},
		{"Basic 0123456789abcdef", ""},
		{"Bearer0123456789abcdef", ""},
		{"0123456789abcdef", ""},
		{"", ""},
	} {
		r := httptest.NewRequest("GET", "/admin/weights", nil)
		if c.header != "" {
			r.Header.Set("Authorization", c.header)
		}
		if got := Match(r, toks); got != c.want {
			t.Errorf("%q: %q, want %q", c.header, got, c.want)
		}
	}
}
