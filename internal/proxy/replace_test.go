package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// A replica's URL changes (a reload, or an operator moving a replica that
// hung to a new host): it "starts afresh under its id", and its old
// attempts finish against the old record. When those attempts fail
// afterwards (the old host's 5xx, or its hang timing out), they say
// nothing of the new replica, as a probe of the old one does not
// (2026-12-05: three of them ejected it before it served a request).
func TestOldAttemptsDoNotEjectTheReplacement(t *testing.T) {
	release := make(chan struct{})
	var posts atomic.Int64
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return // /health: 200
		}
		posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		<-release // hung, until the test lets it fail
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer old.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	healthy := servetest.StartReplica(t, 0, emulator.Faults{})
	s, purl := startProxy(t, testConfig{Fleet: fleet.Config{MaxAttempts: 1}}, servetest.At(old.URL))

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			resp, err := http.Post(purl+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hello", 10, false)))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	eventually(t, "three attempts at the old host", func() bool { return posts.Load() == 3 })

	// The replica moves to a new, healthy host.
	cfg := s.Config()
	cfg.Replicas = []fleet.ReplicaConfig{{ID: "a", URL: healthy.URL, Region: "ra", Profile: "paper"}}
	if _, err := s.Want(fleet.SourceConfig, cfg.Replicas); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new a to be probed", func() bool { return stateOr(s, "a").Available() })

	close(release) // the old host's attempts fail now
	wg.Wait()
	time.Sleep(50 * time.Millisecond)
	_, ejections, until := s.Upstream("a").Health()
	if ejections > 0 || !until.IsZero() {
		t.Errorf("the new a (at %s) was ejected by its predecessor's failures: %d ejections, until %v", healthy.URL, ejections, until)
	}
}
