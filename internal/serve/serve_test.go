package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// A whole router: its admin API shows the replicas and explains
// decisions, its /metrics count the requests, /v1/models is answered by a
// replica, and the client port serves no admin API.
func TestAdminAndMetrics(t *testing.T) {
	s := startRouter(t, Config{}, Options{}, startReplica(t, 5*time.Millisecond, emulator.Faults{}), startReplica(t, 40*time.Millisecond, emulator.Faults{}))
	url, admin := s.client, s.admin
	servetest.Chat(t, url, "warm up", 1)
	get := func(path string) string {
		base := url
		if strings.HasPrefix(path, "/admin") {
			base = admin
		}
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	if body := get("/admin/replicas"); !strings.Contains(body, `"state": "active"`) || !strings.Contains(body, `"policy": "gorgo-e2e"`) {
		t.Errorf("/admin/replicas: %s", body)
	}
	if body := get("/metrics"); !strings.Contains(body, `gorgo_requests_total{code="200",model="gorgo-emulated",replica="a"} 1`) {
		t.Errorf("/metrics lacks the request: %s", body)
	}
	if body := get("/v1/models"); !strings.Contains(body, "gorgo-emulated") {
		t.Errorf("/v1/models: %s", body)
	}
	// The client port serves no admin API.
	if resp, err := http.Get(url + "/admin/replicas"); err != nil || resp.StatusCode != 404 {
		t.Errorf("client port /admin/replicas: %v %v", resp.StatusCode, err)
	}
	resp, err := http.Post(admin+"/admin/decide", "application/json", strings.NewReader(chatBody("where would this go?", 1, false)))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Replica  string
		Scores   map[string]struct{ Total, Decode float64 }
		Expected int     `json:"expected_output_tokens"`
		Pred     float64 `json:"predicted_ttft_ms"`
		Idle     float64 `json:"predicted_ttft_idle_ms"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	// max_tokens 1 caps the expected output; the default policy prices a
	// decode on every replica; the prediction is at least the idle one.
	if d.Replica != "a" || len(d.Scores) != 2 || d.Scores["a"].Decode <= 0 || d.Expected != 1 || d.Idle <= 0 || d.Pred < d.Idle {
		t.Errorf("decide: %+v", d)
	}
}
