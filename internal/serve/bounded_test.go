package serve

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/tracing/tracingtest"
)

// A client's model name of a megabyte (while a replica's models are
// unknown, any name may be served) is refused, and kept neither in spans
// nor in the live view, which would hold it for every such request.
func TestClientModelNameIsBounded(t *testing.T) {
	rc := tracingtest.Start(t)
	rep := servetest.Fake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})
	s := startRouter(t, Config{Tracing: tracing.Config{Endpoint: rc.URL}}, Options{}, rep)
	model := strings.Repeat("m", 1<<20) // 1 MiB
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	if code, out := do(t, "POST", s.client+"/v1/chat/completions", body); code != 400 || len(out) > 1024 {
		t.Errorf("a model name of 1 MiB: %d %.200s (%d bytes)", code, out, len(out))
	}
	body = `{"model":"` + strings.Repeat("m", 256) + `","messages":[{"role":"user","content":"hi"}]}`
	if code, out := do(t, "POST", s.client+"/v1/chat/completions", body); code != 200 {
		t.Errorf("a model name of 256 bytes: %d %.200s", code, out)
	}
	// The live view keeps its last decisions, model and all.
	_, snap := func() (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.admin+"/admin/ui/stream", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 4<<20)
		n, total := 0, 0
		for total < len(buf) {
			n, err = resp.Body.Read(buf[total:])
			total += n
			if err != nil || strings.Contains(string(buf[:total]), "\n\n") {
				break
			}
		}
		return resp.StatusCode, string(buf[:total])
	}()
	if len(snap) > 256<<10 {
		t.Errorf("the live view's snapshot after one request is %d bytes: it holds the client's 1 MiB model name", len(snap))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, sp := range rc.Spans() {
		m, ok := sp.Attrs["gen_ai.request.model"].(string)
		if ok {
			named++
		}
		if len(m) > tracing.MaxAttributeLen {
			t.Errorf("span %s holds a %d-byte gen_ai.request.model", sp.Name, len(m))
		}
	}
	if named == 0 {
		t.Error("no span names the model: nothing was checked")
	}
}
