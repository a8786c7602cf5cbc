package tenant

import (
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
)

func set(t *testing.T, cfgs map[string]Config) *Set {
	t.Helper()
	s, err := New(cfgs, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConfig(t *testing.T) {
	s := set(t, map[string]Config{
		"chat":  {Weight: 3, Priority: "interactive"},
		"batch": {Priority: "batch", MaxPriority: "standard", TTFTSLO: time.Minute, MinTTFTSLO: 10 * time.Second},
	})
	if got := s.Names(); strings.Join(got, ",") != "batch,chat,default" {
		t.Errorf("names %v", got)
	}
	if s.Lookup("nobody").Name != Default || s.Lookup("").Name != Default || s.Lookup("chat").Name != "chat" {
		t.Error("Lookup")
	}
	if w := s.Weights(); w["chat"] != 3 || w["batch"] != 1 || w[Default] != 1 {
		t.Errorf("weights %v", w)
	}
	for _, bad := range []map[string]Config{
		{"a b": {}},
		{Other: {}}, // the metrics' label of the tenants not named so (2026-12-07, a review)
		{"x": {Weight: -1}},
		{"x": {Priority: "urgent"}},
		{"x": {Priority: "interactive", MaxPriority: "batch"}},
		{"x": {TTFTSLO: time.Second, MinTTFTSLO: 2 * time.Second}},
		{"x": {TokensPerMinute: -5}},
	} {
		if _, err := New(bad, time.Second); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// A request's class: the tenant's priority and SLO, or what it asks within
// what the tenant may; anything else is an error, never an upgrade.
func TestClass(t *testing.T) {
	s := set(t, map[string]Config{
		"batch": {Priority: "batch", MaxPriority: "standard", TTFTSLO: time.Minute, MinTTFTSLO: 10 * time.Second, MinTPOTSLO: 20 * time.Millisecond},
	})
	b := s.Lookup("batch")
	c, tpot, err := b.Class(Ask{}, 100)
	if err != nil || c.Priority != admit.Batch || c.SLO != time.Minute || c.Tenant != "batch" || c.Tokens != 100 || tpot != 0 {
		t.Fatalf("%+v %v %v", c, tpot, err)
	}
	c, tpot, err = b.Class(Ask{Priority: "standard", TTFTSLO: "15000", TPOTSLO: "25.5"}, 1)
	if err != nil || c.Priority != admit.Standard || c.SLO != 15*time.Second || tpot != 25500*time.Microsecond {
		t.Errorf("within bounds: %+v %v %v", c, tpot, err)
	}
	if c, _, err := b.Class(Ask{Priority: "sheddable"}, 1); err != nil || c.Priority != admit.Sheddable {
		t.Errorf("asking for less: %+v %v", c, err)
	}
	for _, a := range []Ask{
		{Priority: "interactive"}, {Priority: "urgent"}, {Priority: "99"},
		{TTFTSLO: "500"}, {TTFTSLO: "abc"}, {TTFTSLO: "-1"}, {TTFTSLO: "NaN"}, {TTFTSLO: "1e30"}, {TTFTSLO: "700000"},
		{TPOTSLO: "5"}, {TPOTSLO: "0"},
	} {
		if c, _, err := b.Class(a, 1); err == nil {
			t.Errorf("%+v accepted: %+v", a, c)
		}
	}
	if _, _, err := s.Lookup("x").Class(Ask{Priority: "batch"}, 1); err != nil {
		t.Errorf("the default tenant asking for less: %v", err)
	}
	// A tenant that sets no floor on TPOT asks has the default's, 5 ms.
	if _, _, err := s.Lookup("x").Class(Ask{TPOTSLO: "0.001"}, 1); err == nil {
		t.Error("a TPOT of 1 µs asked for and accepted")
	}
	if _, tpot, err := s.Lookup("x").Class(Ask{TPOTSLO: "5"}, 1); err != nil || tpot != 5*time.Millisecond {
		t.Errorf("a TPOT of 5 ms: %v %v", tpot, err)
	}
}

// Budgets: a tenant over its tokens per minute is refused with how long to
// wait, gets through once the minute allows, and is charged what it used.
func TestBudgets(t *testing.T) {
	s := set(t, map[string]Config{"a": {TokensPerMinute: 6000, RequestsPerMinute: 3}})
	a := s.Lookup("a")
	t0 := time.Unix(1000, 0)
	g, ref := a.Admit(t0, 4000, 0)
	if ref != nil {
		t.Fatal(ref.Message)
	}
	g.Settle(t0, 5000) // it used 1,000 more than charged
	h := http.Header{}
	a.Headers(t0, h.Set)
	if h.Get("X-Ratelimit-Limit-Tokens") != "6000" || h.Get("X-Ratelimit-Remaining-Tokens") != "1000" || h.Get("X-Ratelimit-Reset-Tokens") != "50s" ||
		h.Get("X-Ratelimit-Limit-Requests") != "3" || h.Get("X-Ratelimit-Remaining-Requests") != "2" || h.Get("X-Ratelimit-Reset-Requests") != "20s" {
		t.Errorf("headers %v", h)
	}
	_, ref = a.Admit(t0, 2000, 0)
	if ref == nil || ref.RetryAfter != 10*time.Second || !strings.Contains(ref.Message, "6000 tokens per minute") {
		t.Fatalf("over budget: %+v", ref)
	}
	// The refusal charged nothing: 10 s later it goes.
	if _, ref = a.Admit(t0.Add(10*time.Second), 2000, 0); ref != nil {
		t.Errorf("after 10 s: %s", ref.Message)
	}
	// A request larger than the whole budget never goes.
	if _, ref = a.Admit(t0.Add(time.Hour), 7000, 0); ref == nil || !ref.Never || ref.RetryAfter != 0 {
		t.Errorf("too large: %+v", ref)
	}
	// The answer expected is charged up front, so a burst cannot spend many
	// times the budget before its first request ends (found in review: 100
	// requests of 100-token prompts and 4,000-token answers all went at
	// once against 10,000 tokens a minute); a prompt that fits the budget
	// with an answer that would not still goes, charged the whole budget.
	burst := set(t, map[string]Config{"burst": {TokensPerMinute: 10000}}).Lookup("burst")
	went := 0
	for range 100 {
		if _, ref := burst.Admit(t0, 100, 4000); ref == nil {
			went++
		}
	}
	if went != 2 {
		t.Errorf("%d of a burst of 100 went, want 2 (of 4,100 tokens each against 10,000)", went)
	}
	if g, ref := set(t, map[string]Config{"big": {TokensPerMinute: 1000}}).Lookup("big").Admit(t0, 500, 4000); ref != nil || g.charged != 1000 {
		t.Errorf("a 500-token prompt expecting 4,000 more against 1,000 a minute: charged %d, %+v", g.charged, ref)
	}
	// Three requests a minute.
	b := set(t, map[string]Config{"b": {RequestsPerMinute: 3}}).Lookup("b")
	for i := range 3 {
		if _, ref := b.Admit(t0, 10, 0); ref != nil {
			t.Fatalf("request %d: %s", i, ref.Message)
		}
	}
	if _, ref := b.Admit(t0, 10, 0); ref == nil || ref.RetryAfter != 20*time.Second {
		t.Errorf("fourth request: %+v", ref)
	}
	// Charged too much: given back.
	c := set(t, map[string]Config{"c": {TokensPerMinute: 1000}}).Lookup("c")
	g, _ = c.Admit(t0, 800, 0)
	g.Settle(t0, 300)
	if left, _ := c.tokens.state(t0); left != 700 {
		t.Errorf("after settling 300 of 800: %d left, want 700", left)
	}
}

// A tenant's budget is the fleet's: every charge made here is told (to
// the other routers of a mesh), and theirs are charged here.
func TestSharedBudgets(t *testing.T) {
	s := set(t, map[string]Config{"a": {TokensPerMinute: 6000, RequestsPerMinute: 3}, "free": {}})
	type charge struct {
		tenant           string
		requests, tokens float64
	}
	var told []charge
	s.Share(func(tenant string, requests, tokens float64) { told = append(told, charge{tenant, requests, tokens}) })
	a := s.Lookup("a")
	t0 := time.Unix(1000, 0)
	g, ref := a.Admit(t0, 400, 0)
	if ref != nil {
		t.Fatal(ref.Message)
	}
	g.Settle(t0, 900)
	g2, _ := a.Admit(t0, 100, 0)
	g2.Refund(t0)
	s.Lookup("free").Admit(t0, 100, 0) // no budget: nothing to tell
	want := []charge{{"a", 1, 400}, {"a", 0, 500}, {"a", 1, 100}, {"a", -1, 0}, {"a", 0, -100}}
	if !slices.Equal(told, want) {
		t.Errorf("told %v, want %v", told, want)
	}
	// Another router's charges count here: after one of its requests and
	// one of ours, one is left of three.
	s.ChargeRemote(t0, "a", 1, 1000)
	s.ChargeRemote(t0, "nobody", 5, 5)
	s.ChargeRemote(t0, "a", math.NaN(), 0)
	if _, ref := a.Admit(t0, 10, 0); ref != nil {
		t.Fatalf("the third request: %s", ref.Message)
	}
	if _, ref := a.Admit(t0, 10, 0); ref == nil || !strings.Contains(ref.Message, "3 requests per minute") {
		t.Errorf("a fourth request in the fleet's minute: %+v", ref)
	}
}

// Times out of order (a request's arrival, another's end) never refill a
// stretch twice (found in review: a slow upload wound the clock back).
func TestBudgetClockNeverRewinds(t *testing.T) {
	a := set(t, map[string]Config{"a": {TokensPerMinute: 600}}).Lookup("a")
	t0 := time.Unix(1000, 0)
	if _, ref := a.Admit(t0.Add(50*time.Second), 590, 0); ref != nil {
		t.Fatal(ref.Message)
	}
	a.Admit(t0, 1, 0) // an earlier time: refused or not, no rewind
	if left, _ := a.tokens.state(t0.Add(51 * time.Second)); left > 20 {
		t.Errorf("%d tokens left a second later, want about 10", left)
	}
	// A refund gives back the request and its tokens.
	b := set(t, map[string]Config{"b": {TokensPerMinute: 600, RequestsPerMinute: 1}}).Lookup("b")
	g, _ := b.Admit(t0, 300, 0)
	g.Refund(t0)
	if _, ref := b.Admit(t0, 600, 0); ref != nil {
		t.Errorf("after a refund: %s", ref.Message)
	}
}

func TestHeaderRule(t *testing.T) {
	for _, c := range []struct {
		rule        HeaderRule
		key, header string
		want        string
		err         bool
	}{
		{"", "k", "", "k", false},
		{"", "k", "vip", "", true},
		{HeaderRefuse, "", "vip", "", true},
		{HeaderIgnore, "k", "vip", "k", false},
		{HeaderTrust, "k", "vip", "vip", false},
		{HeaderTrust, "k", "", "k", false},
	} {
		got, err := c.rule.Name(c.key, c.header)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%q.Name(%q, %q) = %q, %v", c.rule, c.key, c.header, got, err)
		}
	}
	if HeaderRule("sometimes").Check() == nil || HeaderTrust.Check() != nil {
		t.Error("Check")
	}
}

// A reload's tenants carry what the budgets of the same names spent: a
// smaller budget keeps it spent (its level below zero until it refills),
// a budget new to a tenant starts full.
func TestCarry(t *testing.T) {
	now := time.Unix(1000, 0)
	prev, _ := New(map[string]Config{"a": {RequestsPerMinute: 5}, "b": {}}, 0)
	for range 4 {
		if _, r := prev.Lookup("a").Admit(now, 1, 0); r != nil {
			t.Fatal(r.Message)
		}
	}
	next, _ := New(map[string]Config{"a": {RequestsPerMinute: 2}, "b": {RequestsPerMinute: 3}}, 0)
	next.Carry(prev, now)
	if _, r := next.Lookup("a").Admit(now, 1, 0); r == nil || r.RetryAfter < 59*time.Second {
		t.Errorf("a, 4 spent of a budget now of 2: %+v, want refused for a minute or so", r)
	}
	for range 3 {
		if _, r := next.Lookup("b").Admit(now, 1, 0); r != nil {
			t.Errorf("b's new budget: %s", r.Message)
		}
	}
}
