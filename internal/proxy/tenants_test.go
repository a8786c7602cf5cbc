package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// send posts a chat completion with the headers and returns the status,
// the body and the answer's headers.
func send(t *testing.T, url, body string, headers map[string]string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// A tenant over its tokens per minute gets a 429 in OpenAI's shape with
// Retry-After and the x-ratelimit-* headers (on answers too), and gets
// through once the minute allows.
func TestTenantTokenBudget(t *testing.T) {
	a := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{
		Fleet: fleet.Config{ProbeInterval: time.Hour, Tenants: map[string]tenant.Config{"a": {TokensPerMinute: 600}}},
		Proxy: Config{TenantHeader: "trust"}}, a)
	who := map[string]string{tenant.TenantHeader: "a"}
	prompt := strings.Repeat("word ", 80) // about 100 estimated tokens
	var h http.Header
	var code int
	var body string
	served := 0
	for range 20 {
		if code, body, h = send(t, url, chatBody(prompt, 2, false), who); code != 200 {
			break
		}
		served++
		if h.Get("X-Ratelimit-Limit-Tokens") != "600" || h.Get("X-Ratelimit-Remaining-Tokens") == "" || h.Get("X-Ratelimit-Reset-Tokens") == "" {
			t.Fatalf("an answer without the budget's headers: %v", h)
		}
	}
	if code != 429 || served < 3 || served > 6 || !strings.Contains(body, `"type":"RateLimitError"`) || !strings.Contains(body, "600 tokens per minute") {
		t.Fatalf("after %d served: %d %s", served, code, body)
	}
	retry, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 60 || h.Get("X-Ratelimit-Limit-Tokens") != "600" {
		t.Fatalf("refusal headers %v", h)
	}
	if left, _ := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Tokens")); left >= 110 {
		t.Errorf("refused with %d tokens left", left)
	}
	if n := counter(t, s.reg, "gorgo_tenant_refused_total", map[string]string{"tenant": "a", "priority": "standard", "reason": "budget"}); n != 1 {
		t.Errorf("budget refusals counted: %v, want 1", n)
	}
	if !strings.Contains(body, `"code":"rate_limit_exceeded"`) || h.Get("X-Should-Retry") != "" {
		t.Errorf("a refusal to retry later: X-Should-Retry %q, %s", h.Get("X-Should-Retry"), body)
	}
	// A prompt larger than the whole budget never goes: no Retry-After,
	// and OpenAI's SDKs told not to retry it (2026-12-07, a user's test:
	// the SDK sent it three times).
	code, body, h = send(t, url, chatBody(strings.Repeat("word ", 800), 2, false), who)
	if code != 429 || h.Get("Retry-After") != "" || h.Get("X-Should-Retry") != "false" || !strings.Contains(body, "more than tenant a's budget") {
		t.Errorf("a prompt over the whole budget: %d, Retry-After %q, X-Should-Retry %q, %s", code, h.Get("Retry-After"), h.Get("X-Should-Retry"), body)
	}
	// Another tenant is not held back.
	if code, body, _ := send(t, url, chatBody(prompt, 2, false), nil); code != 200 {
		t.Errorf("the default tenant: %d %s", code, body)
	}
	time.Sleep(time.Duration(retry)*time.Second + 200*time.Millisecond)
	if code, body, _ := send(t, url, chatBody(prompt, 2, false), who); code != 200 {
		t.Errorf("after Retry-After: %d %s", code, body)
	}
}

// A request for n answers is charged, until it is settled, the prompt and
// n answers of the length the router expects (here max_tokens, 100).
func TestTenantChargedForEveryAnswer(t *testing.T) {
	a := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{
		Fleet: fleet.Config{ProbeInterval: time.Hour, Tenants: map[string]tenant.Config{"a": {TokensPerMinute: 10000}, "b": {TokensPerMinute: 10000}}},
		Proxy: Config{TenantHeader: "trust"}}, a)
	prompt := strings.Repeat("word ", 80) // about 100 estimated tokens
	left := func(tenantName string, n int) int {
		body := strings.Replace(chatBody(prompt, 100, false), `"max_tokens"`, fmt.Sprintf(`"n":%d,"max_tokens"`, n), 1)
		code, out, h := send(t, url, body, map[string]string{tenant.TenantHeader: tenantName})
		if code != 200 {
			t.Fatalf("n=%d: %d %s", n, code, out)
		}
		left, err := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Tokens"))
		if err != nil {
			t.Fatal(err)
		}
		return left
	}
	one, four := left("a", 1), left("b", 4)
	if charged := one - four; charged < 250 || charged > 350 {
		t.Errorf("charged %d tokens more for four answers than for one, want 300", charged)
	}
}

// What a client may not ask for is a 400 naming the header, never a
// silent upgrade; a tenant header from a client the listener does not
// trust is refused.
func TestTenantAsksOutOfBounds(t *testing.T) {
	a := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	before := a.Served()
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, TTFTSLO: 10 * time.Second,
		Tenants: map[string]tenant.Config{"default": {Priority: "standard", MinTTFTSLO: time.Second, MinTPOTSLO: 10 * time.Millisecond}}}}, a)
	for _, c := range []struct {
		headers map[string]string
		want    string
	}{
		{map[string]string{tenant.PriorityHeader: "interactive"}, "X-Gorgo-Priority: interactive is above"},
		{map[string]string{tenant.PriorityHeader: "urgent"}, "unknown priority"},
		{map[string]string{tenant.TTFTSLOHeader: "fast"}, "not a positive number"},
		{map[string]string{tenant.TTFTSLOHeader: "100"}, "outside what tenant default may ask"},
		{map[string]string{tenant.TPOTSLOHeader: "1"}, "tighter than tenant default may ask"},
		{map[string]string{tenant.TenantHeader: "vip"}, "may not name their tenant"},
	} {
		code, body, _ := send(t, url, chatBody("hi", 2, false), c.headers)
		if code != 400 || !strings.Contains(body, c.want) {
			t.Errorf("%v: %d %s", c.headers, code, body)
		}
	}
	if n := a.Served() - before; n != 0 {
		t.Errorf("%d refused requests reached the replica", n)
	}
	for _, ok := range []map[string]string{{tenant.PriorityHeader: "batch"}, {tenant.TTFTSLOHeader: "2000", tenant.TPOTSLOHeader: "50"}} {
		if code, body, _ := send(t, url, chatBody("hi", 2, false), ok); code != 200 {
			t.Errorf("%v: %d %s", ok, code, body)
		}
	}
}

// counter is the value of the counter name with the labels in reg (0 if
// absent).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// A non-streaming answer too long to hold is passed through, and its usage
// read from its last bytes: its completion tokens are charged to the
// tenant's budget (found in review: only the prompt was, so long answers,
// large logprobs, escaped the budget).
func TestLongAnswerIsCharged(t *testing.T) {
	long := `{"choices":[{"message":{"content":"` + strings.Repeat("x", 8000) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":900}}`
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, long)
	})
	_, url := startProxy(t, testConfig{
		Fleet: fleet.Config{ProbeInterval: time.Hour, Tenants: map[string]tenant.Config{"a": {TokensPerMinute: 1000}}},
		Proxy: Config{TenantHeader: "trust", MaxAnswerBytes: 1024}}, up)
	who := map[string]string{tenant.TenantHeader: "a"}
	if code, body, _ := send(t, url, chatBody("hi", 1, false), who); code != 200 || body != long {
		t.Fatalf("the long answer: %d, %d bytes", code, len(body))
	}
	code, _, h := send(t, url, chatBody("hi", 1, false), who)
	left, err := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Tokens"))
	if code != 200 || err != nil || left > 100 {
		t.Errorf("after an answer of 900 tokens: %d, %q tokens left; want at most 100", code, h.Get("X-Ratelimit-Remaining-Tokens"))
	}
}

// A request refused for what it asks (a priority above its tenant's
// max_priority) is counted in its tenant's band, not standard's
// (2026-12-07, a user's test: an interactive tenant's bad requests were
// counted as standard).
func TestBadAskCountedInTheTenantsBand(t *testing.T) {
	s, url := startProxy(t, testConfig{
		Fleet: fleet.Config{ProbeInterval: time.Hour, Tenants: map[string]tenant.Config{"chat": {Priority: "interactive"}}},
		Proxy: Config{TenantHeader: "trust"}}, startReplica(t, 5*time.Millisecond, emulator.Faults{}))
	if code, body, _ := send(t, url, chatBody("hi", 2, false), map[string]string{tenant.TenantHeader: "chat", "X-Gorgo-Priority": "critical"}); code != 400 {
		t.Fatalf("a priority above the tenant's: %d %s", code, body)
	}
	if n := counter(t, s.reg, "gorgo_tenant_refused_total", map[string]string{"tenant": "chat", "priority": "interactive", "reason": "bad_request"}); n != 1 {
		t.Errorf("bad requests counted in the tenant's band: %v, want 1", n)
	}
}

// A request no replica served is charged nothing, and its answer's
// budget headers say so (2026-12-07, a user's test: a 503 showed the
// budget less the request it had given back).
func TestUnservedRequestShowsItsBudgetWhole(t *testing.T) {
	failing := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "broken", http.StatusInternalServerError)
	})
	_, url := startProxy(t, testConfig{
		Fleet: fleet.Config{ProbeInterval: time.Hour, Tenants: map[string]tenant.Config{"a": {RequestsPerMinute: 3}}},
		Proxy: Config{TenantHeader: "trust"}}, failing)
	code, body, h := send(t, url, chatBody("hi", 2, false), map[string]string{tenant.TenantHeader: "a"})
	if code < 500 || h.Get("X-Ratelimit-Remaining-Requests") != "3" {
		t.Errorf("unserved: %d, X-Ratelimit-Remaining-Requests %q, want 3 (%s)", code, h.Get("X-Ratelimit-Remaining-Requests"), body)
	}
}
