package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// A stream whose replica sends its headers and then nothing is given up on
// after the idle limit, and served by another replica (nothing reached the
// client yet).
func TestStallBeforeTheFirstEventFailsOver(t *testing.T) {
	stall := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 200 * time.Millisecond}}, stall, good)
	client := &http.Client{Timeout: 20 * time.Second} // the failure would be a hang
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", 1, true)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(ReplicaHeader) != "b" || !strings.Contains(string(body), "[DONE]") {
		t.Errorf("status %d from %q: %.200s", resp.StatusCode, resp.Header.Get(ReplicaHeader), body)
	}
}

// A 404 whose body stalls is given up on after the idle limit, as a stream
// is, and the request is served by another replica (found in review: the
// body was read with no limit, and the request hung).
func TestStalled404FailsOver(t *testing.T) {
	stall := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"message":"The model`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 200 * time.Millisecond}}, stall, good)
	client := &http.Client{Timeout: 20 * time.Second} // the failure would be a hang
	for _, stream := range []bool{false, true} {
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", 1, stream)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(ReplicaHeader) != "b" {
			t.Errorf("stream %v: status %d from %q: %.200s", stream, resp.StatusCode, resp.Header.Get(ReplicaHeader), body)
		}
	}
}
