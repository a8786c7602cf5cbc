package emulator

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
)

// An output of 2^63 tokens, asked by max_tokens or by the replayer's
// header, is refused as past the context (the check used to add prompt
// and output, which wrapped, and the replica set out to generate it).
func TestHugeOutputIsRefused(t *testing.T) {
	_, url := start(t, Config{Speedup: 50})
	for _, tc := range []struct{ maxTokens, header string }{
		{"9223372036854775807", ""},
		{"5", "9223372036854775807"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		body := `{"messages":[{"role":"user","content":"hello there"}],"max_tokens":` + tc.maxTokens + `}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if tc.header != "" {
			req.Header.Set(OutputTokensHeader, tc.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("max_tokens %s, header %q: no answer: %v", tc.maxTokens, tc.header, err)
			cancel()
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "maximum context length") {
			t.Errorf("max_tokens %s, header %q: status %d, want 400: %.200s", tc.maxTokens, tc.header, resp.StatusCode, b)
		}
	}
}

// Without max_tokens a prompt near the context is served, its answer cut
// to the context left, as vLLM and SGLang serve it; one that fills the
// context is refused.
func TestNoMaxTokensNearTheContext(t *testing.T) {
	s, url := start(t, Config{Speedup: 1000})
	limit := s.prof.MaxContextTokens
	resp := post(t, url+"/v1/completions", `{"prompt":"`+strings.Repeat("abcd", limit-100)+`"}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("no max_tokens, a prompt 100 tokens short of the context (%d): status %d: %.300s", limit, resp.StatusCode, b)
	}
	resp = post(t, url+"/v1/completions", `{"prompt":"`+strings.Repeat("abcd", limit)+`"}`)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("no max_tokens, a prompt as long as the context: status %d: %.300s", resp.StatusCode, b)
	}
}

// A speed the model clock cannot keep (infinite, or so slow or fast that
// its conversions overflow, and the driver spins) is refused, at start and
// by POST /admin/speed, and the replica keeps serving.
func TestSpeedIsBounded(t *testing.T) {
	prof, err := engine.LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{{Speedup: 1e-300}, {Speedup: 1e300, Faults: Faults{Slowdown: 1e-300}}, {Speedup: 1, Faults: Faults{Slowdown: 1e300}}} {
		c.Profile = prof
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "speedup") {
			t.Errorf("New(speedup %v, slowdown %v): %v, want the speed refused", c.Speedup, c.Faults.Slowdown, err)
		}
	}
	_, url := start(t, Config{Speedup: 50})
	for _, q := range []string{"speedup=Inf", "speedup=1e-300", "slowdown=1e-300", "speedup=NaN"} {
		resp := post(t, url+"/admin/speed?"+q, "")
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", q, resp.StatusCode)
		}
	}
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a request after the refused speeds: status %d", resp.StatusCode)
	}
}

// The model clock's conversions hold their range at the slowest and
// fastest speeds allowed: a step due in the model is due in the wall
// clock's future (the driver sleeps, it does not spin), and the model's
// time does not wrap negative.
func TestClockConversionsDoNotWrap(t *testing.T) {
	now := time.Now()
	slow := newClock(now, minSpeed)
	if at := slow.wall(10 * time.Second); !at.After(now.Add(100 * 365 * 24 * time.Hour)) {
		t.Errorf("at speed %g, 10 s of model time fall due at %v, not centuries ahead", minSpeed, at)
	}
	fast := newClock(now, maxSpeed)
	if m := fast.model(now.Add(time.Hour)); m <= 0 {
		t.Errorf("at speed %g, an hour of wall time is %v of model time", maxSpeed, m)
	}
	fast.setSpeed(now.Add(time.Hour), 1)
	if m := fast.model(now.Add(2 * time.Hour)); m <= 0 {
		t.Errorf("after a change of speed, model time %v", m)
	}
}
