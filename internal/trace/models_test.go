package trace

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadWriteModel(t *testing.T) {
	const in = `{"timestamp": 0, "session_id": "a", "model": "llama:sql-lora", "input_length": 10, "output_length": 5, "hash_ids": [7]}
{"timestamp": 1, "session_id": "b", "model": "", "input_length": 10, "output_length": 5, "hash_ids": [7]}
{"timestamp": 2, "session_id": "c", "input_length": 10, "output_length": 5, "hash_ids": [7]}
`
	got, err := Read(strings.NewReader(in), "m.jsonl", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Model != "llama:sql-lora" || got[1].Model != "" || got[2].Model != "" {
		t.Fatalf("models read: %q %q %q", got[0].Model, got[1].Model, got[2].Model)
	}
	var b bytes.Buffer
	if err := Write(&b, got); err != nil {
		t.Fatal(err)
	}
	want := `{"timestamp":0,"session_id":"a","model":"llama:sql-lora","input_length":10,"output_length":5,"hash_ids":[7]}
{"timestamp":1,"session_id":"b","input_length":10,"output_length":5,"hash_ids":[7]}
{"timestamp":2,"session_id":"c","input_length":10,"output_length":5,"hash_ids":[7]}
`
	if b.String() != want {
		t.Errorf("Write =\n%s\nwant\n%s", b.String(), want)
	}
	again, err := Read(&b, "rt", FormatGorgo)
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Errorf("round trip: %v\n%+v\n%+v", err, again, got)
	}
	// Mooncake's format has no model: the key is ignored, as other keys.
	moon, err := Read(strings.NewReader(`{"timestamp": 0, "model": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}`), "m", FormatAuto)
	if err != nil || moon[0].Model != "" {
		t.Errorf("Mooncake with a model key: %v, %+v", err, moon)
	}
}

func TestParseModelWeights(t *testing.T) {
	good := []struct {
		in   string
		want []ModelWeight
	}{
		{"a:1,b:3", []ModelWeight{{"a", 1}, {"b", 3}}},
		{" a : 0.5 , b:0.5 ,", []ModelWeight{{"a", 0.5}, {"b", 0.5}}},
		{"a,b", []ModelWeight{{"a", 1}, {"b", 1}}},
		{"base:lora-1:2,base:lora-2", []ModelWeight{{"base:lora-1", 2}, {"base:lora-2", 1}}},
		{"a:0,b:1", []ModelWeight{{"a", 0}, {"b", 1}}},
	}
	for _, g := range good {
		got, err := ParseModelWeights(g.in)
		if err != nil || !reflect.DeepEqual(got, g.want) {
			t.Errorf("ParseModelWeights(%q) = %v, %v; want %v", g.in, got, err, g.want)
		}
		if again, err := ParseModelWeights(FormatModelWeights(got)); err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("FormatModelWeights(%v) does not read back: %v, %v", got, again, err)
		}
	}
	for _, bad := range []string{"", ",", ":1", "a:-1", "a:1,a:2", "a:0,b:0", "a:NaN", "a:Inf", "a b:1", "a:1e308,b:1e308"} {
		_, err := ParseModelWeights(bad)
		if err == nil {
			t.Errorf("ParseModelWeights(%q) accepted", bad)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || msg == "" {
			t.Errorf("ParseModelWeights(%q): want a one-line error, got %q", bad, msg)
		}
	}
}

func TestAssignModels(t *testing.T) {
	gen := func() []Request {
		reqs, err := Generate(GenConfig{Preset: "artchat", Seed: 2, Duration: 20 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return reqs
	}
	ws := []ModelWeight{{"a", 1}, {"b", 3}, {"never", 0}}
	reqs := gen()
	AssignModels(reqs, ws, 7)
	bySession := map[string]string{}
	sessions := map[string]int{}
	for _, r := range reqs {
		if r.Model == "" || r.Model == "never" {
			t.Fatalf("request of session %s got model %q", r.Session, r.Model)
		}
		if m, ok := bySession[r.Session]; ok && m != r.Model {
			t.Fatalf("session %s has models %s and %s", r.Session, m, r.Model)
		}
		if _, ok := bySession[r.Session]; !ok {
			sessions[r.Model]++
		}
		bySession[r.Session] = r.Model
	}
	// Sessions are drawn by weight: b's share of sessions is about 3/4.
	n := float64(sessions["a"] + sessions["b"])
	if share := float64(sessions["b"]) / n; math.Abs(share-0.75) > 0.05 {
		t.Errorf("b's share of %v sessions = %.3f, want about 0.75", n, share)
	}
	// Deterministic from the seed; another seed changes the draw.
	again := gen()
	AssignModels(again, ws, 7)
	if !reflect.DeepEqual(again, reqs) {
		t.Error("the same seed assigned different models")
	}
	other := gen()
	AssignModels(other, ws, 8)
	if reflect.DeepEqual(other, reqs) {
		t.Error("another seed assigned the same models")
	}
	// A window of the trace gets the same models for its sessions.
	win := Apply(gen(), Window{Start: 10 * time.Minute}, 1)
	AssignModels(win, ws, 7)
	for _, r := range win {
		if r.Model != bySession[r.Session] {
			t.Fatalf("session %s: %s in a window, %s in the whole trace", r.Session, r.Model, bySession[r.Session])
		}
	}
	// Requests without a session draw one each.
	loose := []Request{{}, {}, {}, {}, {}, {}, {}, {}}
	AssignModels(loose, []ModelWeight{{"x", 1}, {"y", 1}}, 1)
	seen := map[string]bool{}
	for _, r := range loose {
		seen[r.Model] = true
	}
	if !seen["x"] || !seen["y"] {
		t.Errorf("eight sessionless requests all got one model: %+v", loose)
	}
	AssignModels(loose, nil, 1) // no mix: nothing changes
	if loose[0].Model == "" {
		t.Error("AssignModels with no weights cleared the models")
	}
}

func TestStatsModels(t *testing.T) {
	reqs := statsTrace()
	if st := ComputeStats(reqs); st.Models != nil {
		t.Fatalf("a trace without models has models %+v", st.Models)
	}
	// a's two requests name m1, b names m2, c none; c's block 1 is no
	// longer shared with the others (another model's cache), nor b's with a.
	reqs[0].Model, reqs[1].Model, reqs[2].Model = "m1", "m2", "m1"
	st := ComputeStats(reqs)
	want := []ModelShare{
		{Name: "m1", Requests: 2, Share: 0.5, Sessions: 1},
		{Name: "", Requests: 1, Share: 0.25, Sessions: 1},
		{Name: "m2", Requests: 1, Share: 0.25, Sessions: 1},
	}
	if !reflect.DeepEqual(st.Models, want) {
		t.Errorf("Models = %+v, want %+v", st.Models, want)
	}
	const total = 1024 + 600 + 1600 + 300
	if got, w := st.Reuse.Global, 1024.0/total; math.Abs(got-w) > 1e-12 {
		t.Errorf("reuse with models = %v, want only a's second turn's 1024 tokens: %v", got, w)
	}
	var b bytes.Buffer
	if err := st.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	tail := `models                 3
  m1                   50.00% (2 requests, 1 sessions)
  (none)               25.00% (1 requests, 1 sessions)
  m2                   25.00% (1 requests, 1 sessions)
`
	if !strings.HasSuffix(b.String(), tail) {
		t.Errorf("WriteText =\n%s\nwant it to end with\n%s", b.String(), tail)
	}
}

func TestTenants(t *testing.T) {
	mix, err := ParseTenants("chat:interactive:0.7:1s, batch:batch:0.3")
	if err != nil || FormatTenants(mix) != "chat:interactive:0.7:1s,batch:batch:0.3" || mix[0].SLO != time.Second || mix[1].SLO != 0 {
		t.Fatalf("%v %v", mix, err)
	}
	for _, bad := range []string{"", "chat:urgent:1", "a:batch:-1", "a::1,a::2", "a b:batch:1", "a:batch:1:2", "a:batch:0",
		"a:batch:1:0s", "a:batch:1:-1s", "a:batch:1:1s:x"} {
		if _, err := ParseTenants(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	reqs, err := Generate(GenConfig{Preset: "artchat", Duration: 10 * time.Minute, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	AssignTenants(reqs, mix, 1)
	bySession, n := map[string]string{}, map[string]int{}
	for _, r := range reqs {
		if s, ok := bySession[r.Session]; ok && s != r.Tenant {
			t.Fatalf("session %s has two tenants", r.Session)
		}
		bySession[r.Session] = r.Tenant
		n[r.Tenant]++
		if (r.Tenant == "chat") != (r.Priority == "interactive") || (r.Tenant == "chat") != (r.TTFTSLO == time.Second) {
			t.Fatalf("%+v", r)
		}
	}
	if share := float64(n["chat"]) / float64(len(reqs)); share < 0.6 || share > 0.8 {
		t.Errorf("chat has %.2f of the requests, want about 0.7", share)
	}
	if solo := Tenant(reqs, "batch"); len(solo) != n["batch"] {
		t.Errorf("Tenant: %d, want %d", len(solo), n["batch"])
	}
	// Written and read back, the tenants stay.
	var buf bytes.Buffer
	if err := Write(&buf, reqs[:5]); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&buf, "t", FormatGorgo)
	if err != nil || back[0].Tenant != reqs[0].Tenant || back[0].Priority != reqs[0].Priority {
		t.Errorf("read back %+v, %v", back[0], err)
	}
}
