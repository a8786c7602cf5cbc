package models

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// vLLM's answer with two served names and a LoRA adapter (parent: the
// base), and SGLang's with an adapter.
const vllmList = `{"object":"list","data":[
 {"id":"llama-70b","object":"model","created":1,"owned_by":"vllm","root":"/models/llama","parent":null,"max_model_len":8192},
 {"id":"llama","object":"model","created":1,"owned_by":"vllm","root":"/models/llama","parent":null},
 {"id":"sql-lora","object":"model","created":1,"owned_by":"vllm","root":"/adapters/sql","parent":"llama-70b"}]}`

func TestParseList(t *testing.T) {
	s, err := ParseList([]byte(vllmList))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String(); got != "llama,llama-70b,sql-lora@llama-70b" {
		t.Errorf("set %s", got)
	}
	m, ok := s.Lookup("sql-lora")
	if !ok || !m.IsAdapter() || m.Parent != "llama-70b" || m.Root != "/adapters/sql" {
		t.Errorf("sql-lora: %+v %v", m, ok)
	}
	// SGLang's BASE:ADAPTER names the adapter; a wrong base does not.
	if m, ok := s.Lookup("llama-70b:sql-lora"); !ok || m.ID != "sql-lora" {
		t.Errorf("llama-70b:sql-lora: %+v %v", m, ok)
	}
	if _, ok := s.Lookup("llama:sql-lora"); ok {
		t.Error("an adapter named with a base it does not run on was found")
	}
	if _, ok := s.Lookup("mistral"); ok {
		t.Error("found a model not served")
	}
	if got := strings.Join(s.Bases(), ","); got != "llama,llama-70b" {
		t.Errorf("bases %s", got)
	}
	// An adapter whose parent is not listed runs on the first base.
	s, err = ParseList([]byte(`{"data":[{"id":"a"},{"id":"x","parent":"elsewhere"},{"id":""}]}`))
	if err != nil || s.String() != "a,x@a" {
		t.Errorf("orphan adapter: %v %v", s, err)
	}
	// An adapter with no base at all is dropped.
	if s, err := ParseList([]byte(`{"data":[{"id":"x","parent":"b"}]}`)); err != nil || s.Len() != 0 {
		t.Errorf("adapter without a base: %v %v", s, err)
	}
	// A list of no model is no list (an engine serves one at least).
	if _, err := ParseList([]byte(`{"choices":[]}`)); err == nil {
		t.Error("an answer listing nothing was taken as a list")
	}
}

func TestParseListRefusesWhatWouldGrowTheRouter(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"data":[`)
	for i := range MaxPerReplica + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"m%d"}`, i)
	}
	b.WriteString(`]}`)
	if _, err := ParseList([]byte(b.String())); err == nil {
		t.Error("a list of more names than a replica may list was taken")
	}
	long := strings.Repeat("x", MaxNameBytes+1)
	if _, err := ParseList([]byte(`{"data":[{"id":"` + long + `"}]}`)); err == nil {
		t.Error("a name longer than the limit was taken")
	}
	// One such entry costs the replica that entry, not its whole list
	// (which would leave its models unknown: it would be sent every
	// model's requests); an adapter on an overlong parent runs on the
	// first base.
	s, err := ParseList([]byte(`{"data":[{"id":"m2"},{"id":"` + long + `","parent":"m2"},{"id":"y","parent":"` + long + `"}]}`))
	if err != nil || s.String() != "m2,y@m2" {
		t.Errorf("a list with an overlong name: %v %v", s, err)
	}
	for _, bad := range []string{``, `[]`, `{"data":{}}`, `{"data":[1]}`} {
		if _, err := ParseList([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestSetWithoutAndUnion(t *testing.T) {
	s, err := WithAdapters([]string{"a", "a2"}, []string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Without("x").String(); got != "a,a2,y@a" {
		t.Errorf("without an adapter: %s", got)
	}
	if got := s.Without("a").String(); got != "a2" {
		t.Errorf("without the base its adapters run on: %s", got)
	}
	b, _ := Names("b", "a")
	u := Union(s, nil, b)
	if got := u.String(); got != "a,a2,b,x@a,y@a" {
		t.Errorf("union %s", got)
	}
	if !s.Equal(s.Without("nothing")) || s.Equal(b) || (*Set)(nil).Equal(b) || !(*Set)(nil).Equal(nil) {
		t.Error("Equal")
	}
	if _, err := WithAdapters(nil, []string{"x"}); err == nil {
		t.Error("adapters without a base were taken")
	}
	if _, err := NewSet([]Model{{ID: "x", Parent: "nowhere"}}); err == nil {
		t.Error("an adapter on a base not listed was taken")
	}
}

func parse(t *testing.T, doc string) []Alias {
	t.Helper()
	var m map[string]Spec
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	as, err := ParseAliases(m)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func TestParseAliases(t *testing.T) {
	as := parse(t, "chat: {llama-3.1-70b: 90, llama-3.3-70b: 10}\nsmall: llama-8b\n")
	if len(as) != 2 || as[0].Name != "chat" || len(as[0].Targets) != 2 || as[0].Targets[0] != (Target{"llama-3.1-70b", 90}) ||
		as[1].Targets[0] != (Target{"llama-8b", 1}) {
		t.Errorf("%+v", as)
	}
	for doc, why := range map[string]string{
		"a: {x: 0}":               "no positive weight",
		"a: {x: -1, y: 2}":        "a negative weight",
		"a: {x: .nan}":            "not a number",
		"a: b\nb: c":              "an alias of an alias",
		"a: a":                    "itself",
		"a: ''":                   "an empty target",
		"a: [x]":                  "a list",
		"a: {x: 1e308, y: 1e308}": "an infinite total",
	} {
		var m map[string]Spec
		err := yaml.Unmarshal([]byte(doc), &m)
		if err == nil {
			_, err = ParseAliases(m)
		}
		if err == nil {
			t.Errorf("%s (%s) was taken", doc, why)
		}
	}
}

// A split is exact over requests without sessions (smooth weighted round
// robin), close to its weights over sessions (rendezvous hashing), and a
// session keeps its target, even when the split changes.
func TestSplit(t *testing.T) {
	r := NewResolver(parse(t, "chat: {old: 90, new: 10}"))
	count := map[string]int{}
	for range 10_000 {
		m, alias := r.Resolve("chat", "")
		if !alias {
			t.Fatal("chat is not an alias")
		}
		count[m]++
	}
	if count["old"] != 9000 || count["new"] != 1000 {
		t.Errorf("without sessions: %v, want exactly 9000/1000", count)
	}
	// 10,000 sessions of one request each.
	clear(count)
	first := map[string]string{}
	for i := range 10_000 {
		s := fmt.Sprintf("session-%d", i)
		m, _ := r.Resolve("chat", s)
		first[s] = m
		count[m]++
	}
	if share := float64(count["new"]) / 10_000; math.Abs(share-0.10) > 0.02 {
		t.Errorf("over sessions new got %.3f, want 0.10 ± 0.02", share)
	}
	// Sessions stay where they were, also once the split changes.
	r.Set(parse(t, "chat: {old: 50, new: 50}"))
	moved := 0
	for s, m := range first {
		if got, _ := r.Resolve("chat", s); got != m {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d sessions moved when the split changed", moved)
	}
	// New requests follow the new split.
	clear(count)
	for range 1000 {
		m, _ := r.Resolve("chat", "")
		count[m]++
	}
	if count["new"] != 500 {
		t.Errorf("after the change: %v", count)
	}
	// A target taken out of the split moves its sessions.
	r.Set(parse(t, "chat: {old: 1}"))
	for s := range first {
		if got, _ := r.Resolve("chat", s); got != "old" {
			t.Fatalf("session %s stayed on %s, no longer a target", s, got)
		}
	}
	// A name that is not an alias is itself.
	if m, alias := r.Resolve("old", "s"); m != "old" || alias {
		t.Errorf("old: %s %v", m, alias)
	}
}

// Rendezvous placement is the same on every router (no state), and a
// dry run changes nothing.
func TestSplitIsSharedAndPeekChangesNothing(t *testing.T) {
	a := NewResolver(parse(t, "chat: {x: 1, y: 1, z: 2}"))
	b := NewResolver(parse(t, "chat: {x: 1, y: 1, z: 2}"))
	for i := range 100 {
		s := fmt.Sprint(i)
		ma, _ := a.Resolve("chat", s)
		mb, _ := b.Resolve("chat", s)
		if ma != mb {
			t.Fatalf("session %s: %s on one router, %s on another", s, ma, mb)
		}
	}
	p1, _ := a.Peek("chat", "")
	p2, _ := a.Peek("chat", "")
	r1, _ := a.Resolve("chat", "")
	if p1 != p2 || p1 != r1 {
		t.Errorf("peek %s %s, then resolve %s", p1, p2, r1)
	}
}

// The sticky table stays bounded however many sessions come.
func TestSessionsBounded(t *testing.T) {
	r := NewResolver(parse(t, "chat: {x: 1, y: 1}"))
	for i := range 3 * sessionCap {
		r.Resolve("chat", fmt.Sprint(i))
	}
	if n := len(r.cur) + len(r.old); n > 2*sessionCap {
		t.Errorf("%d sessions kept", n)
	}
}

// The catalog's Lookup of BASE:ADAPTER finds each base's adapter of the
// name, but a base really named so is that base, whichever set lists it.
func TestUnionBaseAdapterNames(t *testing.T) {
	a, err := WithAdapters([]string{"model-a"}, []string{"sql"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := WithAdapters([]string{"model-b"}, []string{"sql"})
	if err != nil {
		t.Fatal(err)
	}
	u := Union(a, b)
	for name, parent := range map[string]string{"model-a:sql": "model-a", "model-b:sql": "model-b"} {
		if m, ok := u.Lookup(name); !ok || m.ID != "sql" || m.Parent != parent {
			t.Errorf("Lookup(%s) = %+v, %v; want sql on %s", name, m, ok, parent)
		}
	}
	real, err := Names("model-a:sql")
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := Union(a, real).Lookup("model-a:sql"); !ok || m.IsAdapter() {
		t.Errorf("a base named model-a:sql resolved to %+v, %v", m, ok)
	}
	if got := Union(a, real).Len(); got != 3 {
		t.Errorf("catalog of %d names, want 3", got)
	}
}
