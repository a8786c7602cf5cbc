package proxy

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// upstreamSeeing is a replica that answers every completion and records
// the Authorization it got.
func upstreamSeeing(t *testing.T) (*replica, func() []string) {
	var mu sync.Mutex
	var seen []string
	r := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost { // scrapes
			return
		}
		io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}`)
	})
	return r, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func keysFile(t *testing.T, lines string) string {
	p := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(p, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// With client keys, the OpenAI API wants one (401 in OpenAI's shape
// otherwise); /health stays open; by default the client's key does not
// reach the replica.
func TestClientAPIKeys(t *testing.T) {
	up, seen := upstreamSeeing(t)
	_, url := startProxy(t, testConfig{Proxy: Config{Auth: AuthConfig{KeysFile: keysFile(t, "team-a sk-aaaaaaaaaaaaaaaaaaaa\n")}}}, up)
	body := chatBody("hi", 1, false)
	for _, h := range [][]string{nil, {"Authorization", "Bearer sk-wrong-wrong-wrong-wrong"}} {
		if code, b := do(t, "POST", url+"/v1/chat/completions", body, h...); code != 401 || !strings.Contains(b, `"code":401`) {
			t.Errorf("header %v: %d %s", h, code, b)
		}
	}
	if code, _ := do(t, "GET", url+"/v1/models", ""); code != 401 {
		t.Errorf("/v1/models without a key: %d", code)
	}
	if code, _ := do(t, "POST", url+"/v1/chat/completions", body, "Authorization", "Bearer sk-aaaaaaaaaaaaaaaaaaaa"); code != 200 {
		t.Errorf("with the key: %d", code)
	}
	if code, _ := do(t, "GET", url+"/health", ""); code != 200 {
		t.Errorf("/health: %d", code)
	}
	if got := seen(); len(got) != 1 || got[0] != "" {
		t.Errorf("the replica saw Authorization %q, want none", got)
	}
}

// What reaches the replica in Authorization: the client's, none, or the
// replica's own key.
func TestUpstreamAuthorization(t *testing.T) {
	t.Setenv("GORGO_TEST_REPLICA_KEY", "engine-secret")
	for _, c := range []struct {
		policy, want string
	}{{upstreamPass, "Bearer client-token"}, {upstreamDrop, ""}, {upstreamReplica, "Bearer engine-secret"}} {
		up, seen := upstreamSeeing(t)
		cfg := testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL, APIKeyEnv: "GORGO_TEST_REPLICA_KEY"}}}, Proxy: Config{Auth: AuthConfig{Upstream: c.policy}}}
		_, url := startProxy(t, cfg)
		do(t, "POST", url+"/v1/chat/completions", chatBody("hi", 1, false), "Authorization", "Bearer client-token")
		if got := seen(); len(got) != 1 || got[0] != c.want {
			t.Errorf("%s: the replica saw %q, want %q", c.policy, got, c.want)
		}
	}
	if err := (Config{Auth: AuthConfig{Upstream: "forge"}}).Defaults().Validate(); err == nil {
		t.Error("an unknown upstream policy accepted")
	}
}

// Past the rate limit a request is answered 429 with Retry-After at once;
// per key, one client's burst does not cost another.
func TestRateLimit(t *testing.T) {
	up, _ := upstreamSeeing(t)
	keys := keysFile(t, "a sk-aaaaaaaaaaaaaaaaaaaa\nb sk-bbbbbbbbbbbbbbbbbbbb\n")
	_, url := startProxy(t, testConfig{Proxy: Config{Auth: AuthConfig{KeysFile: keys}, RateLimit: RateLimitConfig{RequestsPerSecond: 0.001, Burst: 2, PerKey: true}}}, up)
	send := func(key string) (int, string) {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(chatBody("hi", 1, false)))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	for i := range 2 {
		if code, _ := send("sk-aaaaaaaaaaaaaaaaaaaa"); code != 200 {
			t.Fatalf("request %d within the burst: %d", i, code)
		}
	}
	if code, after := send("sk-aaaaaaaaaaaaaaaaaaaa"); code != 429 || after == "" {
		t.Errorf("past the burst: %d, Retry-After %q", code, after)
	}
	if code, _ := send("sk-bbbbbbbbbbbbbbbbbbbb"); code != 200 {
		t.Errorf("another key: %d", code)
	}
}
