package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
)

// PUT /admin/models takes the config's map of aliases, or the list GET
// shows (GET's answer, edited, can be put back: its served models are
// read-only), and says which targets no replica serves (2026-12-07, a
// user's test: GET's shape was refused, and an alias to a model served
// nowhere was taken without a word).
func TestAdminModelsRoundTrip(t *testing.T) {
	s := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	admin := s.adminURL
	if code, body := do(t, "PUT", admin+"/admin/models", `{"aliases":{"chat":"gorgo-emulated"}}`); code != 200 || strings.Contains(body, "warnings") {
		t.Fatalf("PUT the config's map: %d %s", code, body)
	}
	code, got := do(t, "GET", admin+"/admin/models", "")
	if code != 200 || !strings.Contains(got, `"name": "chat"`) || !strings.Contains(got, `"served"`) {
		t.Fatalf("GET: %d %s", code, got)
	}
	edited := strings.Replace(got, `"name": "chat"`, `"name": "talk"`, 1)
	if code, body := do(t, "PUT", admin+"/admin/models", edited); code != 200 || !strings.Contains(body, `"name": "talk"`) || strings.Contains(body, `"name": "chat"`) {
		t.Errorf("PUT GET's answer, edited: %d %s", code, body)
	}
	if code, body := do(t, "POST", s.client+"/v1/chat/completions", `{"model":"talk","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`); code != 200 {
		t.Errorf("a chat for the alias put: %d %s", code, body)
	}
	if code, body := do(t, "PUT", admin+"/admin/models", `{"aliases":{"x":"nosuch"}}`); code != 200 || !strings.Contains(body, "alias x: no replica serves nosuch") {
		t.Errorf("an alias to a model served nowhere: %d %s", code, body)
	}
	for _, bad := range []string{`{}`, `{"aliases":[{"name":"a","targets":[]}]}`, `{"aliases":[{"name":"a","targets":[{"model":"m","weight":1}]},{"name":"a","targets":[{"model":"m","weight":1}]}]}`, `{"aliases":{"a":{"m":-1}}}`, `{"aliases":{"a":"m"},"other":1}`} {
		if code, body := do(t, "PUT", admin+"/admin/models", bad); code != 400 {
			t.Errorf("PUT %s: %d %s, want 400", bad, code, body)
		}
	}
}
