package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// modelReplica is a replica of the test's own serving one model: it
// answers a request that names it, and 404 (as vLLM words it) any other,
// so a request reaches it with its model rewritten or not at all.
func modelReplica(t *testing.T, model string) *replica {
	return servetest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		data, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(data, &body); err != nil || body.Model != model {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"The model %s does not exist.","type":"NotFoundError","code":404}}`, body.Model)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"model":%q,"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}`, model)
	})
}

// writeSplitConfig writes a config of two replicas, one per model, and the
// alias chat split between them.
func writeSplitConfig(t *testing.T, path string, oldW, newW int, old, new *replica) {
	t.Helper()
	doc := fmt.Sprintf(`probe_interval: 1h
config_poll: -1s
admin: {listen: "off"}
policy: round-robin
models:
  chat: {llama-old: %d, llama-new: %d}
replicas:
  - {id: a, url: %q, region: ra, models: [llama-old]}
  - {id: b, url: %q, region: rb, models: [llama-new]}
`, oldW, newW, old.URL, new.URL)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A canary split over 10,000 requests through the router: within 2 points
// of its weights, each session on one target throughout, every body
// rewritten to the target's name; a reload changes the split (no restart)
// and moves no session.
func TestCanarySplit(t *testing.T) {
	old, new := modelReplica(t, "llama-old"), modelReplica(t, "llama-new")
	path := filepath.Join(t.TempDir(), "serve.yaml")
	writeSplitConfig(t, path, 90, 10, old, new)
	s, _ := startFromFile(t, path)

	// Half the requests without a session, half from 500 sessions of 10.
	type result struct {
		session, replica string
	}
	send := func(n int, sessions int, prefix string) []result {
		out := make([]result, n)
		var wg sync.WaitGroup
		work := make(chan int)
		for range 8 {
			wg.Go(func() {
				client := &http.Client{}
				for i := range work {
					var hdr []string
					if sessions > 0 {
						out[i].session = fmt.Sprintf("%s-%d", prefix, i%sessions)
						hdr = []string{"X-Session-ID", out[i].session}
					}
					body := `{"model":"chat","messages":[{"role":"user","content":"hello ` + fmt.Sprint(i) + `"}],"max_tokens":1}`
					req, _ := http.NewRequest("POST", s.client+"/v1/chat/completions", strings.NewReader(body))
					if len(hdr) > 0 {
						req.Header.Set(hdr[0], hdr[1])
					}
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Errorf("request %d: status %d", i, resp.StatusCode)
					}
					out[i].replica = resp.Header.Get("X-Gorgo-Replica")
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		return out
	}
	share := func(rs []result) float64 {
		n := 0
		for _, r := range rs {
			if r.replica == "b" {
				n++
			}
		}
		return float64(n) / float64(len(rs))
	}
	sticky := func(rs []result, first map[string]string) {
		t.Helper()
		for _, r := range rs {
			if r.session == "" {
				continue
			}
			if f, ok := first[r.session]; ok && f != r.replica {
				t.Fatalf("session %s went to %s, then %s", r.session, f, r.replica)
			}
			first[r.session] = r.replica
		}
	}
	noSession, sessions := send(5000, 0, ""), send(5000, 500, "s")
	all := append(append([]result{}, noSession...), sessions...)
	if got := share(all); math.Abs(got-0.10) > 0.02 {
		t.Errorf("the canary got %.3f of 10,000 requests, want 0.10 ± 0.02 (%.3f without sessions, %.3f with)", got, share(noSession), share(sessions))
	}
	t.Logf("90/10: the canary got %.2f%% of 10,000 requests (%.2f%% of 5,000 without a session, %.2f%% of 5,000 in 500 sessions)",
		100*share(all), 100*share(noSession), 100*share(sessions))
	first := map[string]string{}
	sticky(sessions, first)
	if old.Served()+new.Served() != 10_000 {
		t.Errorf("the replicas served %d and %d: a body went out unrewritten", old.Served(), new.Served())
	}

	// The split changes on reload, in the same router; sessions stay.
	writeSplitConfig(t, path, 50, 50, old, new)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	again := send(2000, 500, "s")
	sticky(again, first)
	fresh := send(2000, 0, "")
	if got := share(fresh); math.Abs(got-0.5) > 0.02 {
		t.Errorf("after the reload the canary got %.3f, want 0.50", got)
	}
	newSessions := send(4000, 1000, "t")
	t.Logf("reloaded to 50/50: the canary got %.2f%% of 2,000 requests without a session, %.2f%% of 4,000 in 1,000 new sessions; the old sessions stayed",
		100*share(fresh), 100*share(newSessions))
	if got := share(newSessions); math.Abs(got-0.5) > 0.1 {
		t.Errorf("after the reload new sessions' canary share is %.3f, want about 0.50", got)
	}
}
