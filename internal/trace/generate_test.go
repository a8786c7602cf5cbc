package trace

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestGenerateDeterministic(t *testing.T) {
	for _, preset := range Presets() {
		cfg := GenConfig{Preset: preset, Seed: 7, Duration: 5 * time.Minute}
		a, err := Generate(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Generate(cfg)
		if len(a) == 0 || !reflect.DeepEqual(a, b) {
			t.Errorf("%s: same config gave different workloads (%d and %d requests)", preset, len(a), len(b))
		}
		cfg.Seed = 8
		c, _ := Generate(cfg)
		if reflect.DeepEqual(a, c) {
			t.Errorf("%s: seeds 7 and 8 gave the same workload", preset)
		}
	}
}

func TestGenerateErrors(t *testing.T) {
	tests := []struct {
		cfg  GenConfig
		want string
	}{
		{GenConfig{Preset: "nope"}, `unknown workload preset "nope" (valid: agent, apps, artchat, chat)`},
		{GenConfig{Duration: -time.Second}, "generating artchat: duration must be non-negative, got -1s"},
		{GenConfig{Rate: -1}, "generating artchat: rate must be a finite number >= 0 (0 = preset default), got -1"},
	}
	for _, tt := range tests {
		_, err := Generate(tt.cfg)
		if err == nil || err.Error() != tt.want {
			t.Errorf("Generate(%+v) error = %v\nwant %s", tt.cfg, err, tt.want)
		}
	}
	if got, want := Presets(), []string{"agent", "apps", "artchat", "chat"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Presets() = %v, want %v", got, want)
	}
	for _, p := range Presets() {
		if PresetSummary(p) == "" {
			t.Errorf("preset %s has no summary", p)
		}
	}
}

// TestGenerateConsistent checks the invariants every generated workload
// obeys.
func TestGenerateConsistent(t *testing.T) {
	tests := []struct {
		preset            string
		maxOutput         int
		minTurns, maxTurn int // bounds on a session's planned turns, when checked
	}{
		{"artchat", 128, 0, 0},
		{"chat", 1024, 0, 0},
		{"agent", 256, 4, 12},
	}
	for _, tt := range tests {
		const d = 30 * time.Minute
		reqs, err := Generate(GenConfig{Preset: tt.preset, Seed: 1, Duration: d})
		if err != nil {
			t.Fatal(err)
		}
		type state struct {
			prev *Request
			user string
		}
		sessions := map[string]*state{}
		owner := map[uint64]string{} // block id -> first session to hold it
		for i := range reqs {
			r := &reqs[i]
			if r.Time < 0 || r.Time >= d || (i > 0 && r.Time < reqs[i-1].Time) {
				t.Fatalf("%s: request %d at %v out of order or outside [0, %v)", tt.preset, i, r.Time, d)
			}
			if err := validate(r); err != nil {
				t.Fatalf("%s: request %d: %v", tt.preset, i, err)
			}
			if r.OutputTokens < 1 || r.OutputTokens > tt.maxOutput {
				t.Fatalf("%s: request %d: output %d not in [1, %d]", tt.preset, i, r.OutputTokens, tt.maxOutput)
			}
			if r.Session == "" || r.User == "" || r.Turn < 1 {
				t.Fatalf("%s: request %d lacks session, user or turn: %+v", tt.preset, i, r)
			}
			if tt.maxTurn > 0 && r.Turn > tt.maxTurn {
				t.Fatalf("%s: request %d: turn %d > %d", tt.preset, i, r.Turn, tt.maxTurn)
			}
			s := sessions[r.Session]
			if s == nil {
				s = &state{user: r.User}
				sessions[r.Session] = s
			} else {
				p := s.prev
				if r.Turn != p.Turn+1 || r.User != s.user {
					t.Fatalf("%s: session %s: turn %d (user %s) follows turn %d (user %s)",
						tt.preset, r.Session, r.Turn, r.User, p.Turn, s.user)
				}
				// The conversation is append-only: the previous turn's full
				// blocks start this turn's prompt.
				full := p.InputTokens / BlockTokens
				if r.InputTokens <= p.InputTokens+p.OutputTokens || !slices.Equal(r.HashIDs[:full], p.HashIDs[:full]) {
					t.Fatalf("%s: session %s turn %d does not extend turn %d", tt.preset, r.Session, r.Turn, p.Turn)
				}
				// A partial last block is never reused: the next turn's block
				// there is full and has another id.
				if full < len(p.HashIDs) && r.HashIDs[full] == p.HashIDs[full] {
					t.Fatalf("%s: session %s turn %d reuses turn %d's partial block", tt.preset, r.Session, r.Turn, p.Turn)
				}
			}
			s.prev = r
			for j, id := range r.HashIDs {
				o, seen := owner[id]
				if !seen {
					owner[id] = r.Session
					continue
				}
				// A block held by two sessions lies in a tenant's system
				// prompt: every block before it is shared too, and it is
				// full.
				if o != r.Session && (j+1)*BlockTokens > r.InputTokens {
					t.Fatalf("%s: partial block %d of %s also in %s", tt.preset, id, r.Session, o)
				}
			}
		}
	}
}

func TestGenerateRate(t *testing.T) {
	base, err := Generate(GenConfig{Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	double, err := Generate(GenConfig{Seed: 2, Rate: 2 * presets[DefaultPreset].rate})
	if err != nil {
		t.Fatal(err)
	}
	ratio := float64(len(double)) / float64(len(base))
	if ratio < 1.8 || ratio > 2.2 {
		t.Errorf("doubling the rate gave %d then %d requests (ratio %.2f)", len(base), len(double), ratio)
	}
	st := ComputeStats(double)
	if want := 2 * presets[DefaultPreset].rate; st.RatePerSecond < 0.9*want || st.RatePerSecond > 1.1*want {
		t.Errorf("Rate %.2f gave %.2f req/s", want, st.RatePerSecond)
	}
	short, err := Generate(GenConfig{Seed: 2, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(short); n < 200 || n > 500 || short[n-1].Time >= time.Minute {
		t.Errorf("a one-minute window has %d requests, last at %v", n, short[n-1].Time)
	}
}

// TestPresetShapes checks the chat and agent presets against the shapes
// they claim (artchat has its own calibration test).
func TestPresetShapes(t *testing.T) {
	within := func(name string, got, lo, hi float64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %.4g, want in [%g, %g]", name, got, lo, hi)
		}
	}
	chat, err := Generate(GenConfig{Preset: "chat", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	st := ComputeStats(chat)
	t.Logf("chat: %d requests, %.2f req/s, input p50 %.0f mean %.0f, output p50 %.0f max %d, %.2f requests/session",
		st.Requests, st.RatePerSecond, st.InputTokens.P50, st.InputTokens.Mean, st.OutputTokens.P50, st.OutputTokens.Max, st.RequestsPerSession)
	within("chat rate", st.RatePerSecond, 5.7*0.85, 5.7*1.15)
	within("chat input p50", st.InputTokens.P50, 850, 1150)
	within("chat input mean", st.InputTokens.Mean, 1275, 1725)
	within("chat output p50", st.OutputTokens.P50, 212, 288)
	within("chat output max", float64(st.OutputTokens.Max), 1, 1024)
	within("chat requests/session", st.RequestsPerSession, 2, 3)
	within("chat cross-session reuse", st.Reuse.CrossSession, 0, 0.05)

	agent, err := Generate(GenConfig{Preset: "agent", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	st = ComputeStats(agent)
	// Concurrency by Little's law: the time each episode is open (first
	// arrival to the estimated end of its last response), over the window.
	first, end := map[string]time.Duration{}, map[string]time.Duration{}
	for _, r := range agent {
		if _, ok := first[r.Session]; !ok {
			first[r.Session] = r.Time
		}
		end[r.Session] = r.Time + time.Duration(r.OutputTokens)*10*time.Millisecond
	}
	var open time.Duration
	for s, t0 := range first {
		open += end[s] - t0
	}
	concurrency := open.Seconds() / (30 * time.Minute).Seconds()
	t.Logf("agent: %d requests, %.1f req/s, %.1f concurrent episodes, input p50 %.0f, output p50 %.0f max %d, turns %.1f",
		st.Requests, st.RatePerSecond, concurrency, st.InputTokens.P50, st.OutputTokens.P50, st.OutputTokens.Max, st.TurnsPerMultiTurnSession)
	within("agent concurrent episodes", concurrency, 128*0.85, 128*1.15)
	within("agent rate", st.RatePerSecond, 90*0.9, 90*1.1)
	within("agent output max", float64(st.OutputTokens.Max), 1, 256)
	within("agent output p50", st.OutputTokens.P50, 20, 80)
}

func BenchmarkGenerateArtchat30m(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Generate(GenConfig{Seed: 1, Duration: 30 * time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
}
