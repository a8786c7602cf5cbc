package trace

import (
	"cmp"
	"reflect"
	"slices"
	"testing"
)

func TestDeriveSessions(t *testing.T) {
	type want struct {
		sessions []string
		turns    []int
	}
	tests := []struct {
		name  string
		chain [][]uint64
		want  want
	}{
		{
			name: "shared system prompt separates conversations",
			// Block 0 has two children that continue (1 and 3): shared.
			chain: [][]uint64{{0, 1, 2}, {0, 3, 4}, {0, 1, 2, 5}, {0, 3, 4, 6, 7}, {0}},
			want:  want{[]string{"s1", "s2", "s1", "s2", "s3"}, []int{1, 1, 2, 2, 1}},
		},
		{
			name: "partial last blocks are leaves, not forks",
			// Block 10 has children 11 (a leaf: turn 1's partial block) and
			// 12 (continues): not shared.
			chain: [][]uint64{{10, 11}, {10, 12, 13}, {10, 12, 14, 15}},
			want:  want{[]string{"s1", "s1", "s1"}, []int{1, 2, 3}},
		},
		{
			name: "a fork point and its ancestors are shared",
			// Block 2 has two continuing children (3 and 5): 0, 1, 2 shared.
			chain: [][]uint64{{0, 1, 2}, {0, 1, 2, 3, 4}, {0, 1, 2, 5, 6}, {0, 1, 2, 3, 4, 8}},
			want:  want{[]string{"s1", "s2", "s3", "s2"}, []int{1, 1, 1, 2}},
		},
		{
			name:  "nothing seen before starts a session",
			chain: [][]uint64{{1}, {2}, {3, 4}},
			want:  want{[]string{"s1", "s2", "s3"}, []int{1, 1, 1}},
		},
		{
			name:  "a repeated prompt continues its session",
			chain: [][]uint64{{20, 21}, {30}, {20, 21}, {30, 31}},
			want:  want{[]string{"s1", "s2", "s1", "s2"}, []int{1, 1, 2, 2}},
		},
		{
			name:  "deepest seen block decides",
			chain: [][]uint64{{0, 1, 2}, {0, 3, 4}, {0, 1, 2, 9, 10}, {0, 3, 4, 11}},
			want:  want{[]string{"s1", "s2", "s1", "s2"}, []int{1, 1, 2, 2}},
		},
	}
	for _, tt := range tests {
		reqs := make([]Request, len(tt.chain))
		for i, ids := range tt.chain {
			reqs[i] = Request{Session: "old", Turn: 9, InputTokens: len(ids) * BlockTokens, HashIDs: ids}
		}
		n := DeriveSessions(reqs)
		var got want
		for _, r := range reqs {
			got.sessions = append(got.sessions, r.Session)
			got.turns = append(got.turns, r.Turn)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
		if wantN := len(slices.Compact(slices.Sorted(slices.Values(tt.want.sessions)))); n != wantN {
			t.Errorf("%s: DeriveSessions = %d, want %d", tt.name, n, wantN)
		}
	}
	if n := DeriveSessions(nil); n != 0 {
		t.Errorf("DeriveSessions(nil) = %d", n)
	}
}

// agreement returns the fraction of requests whose derived session maps to
// their true session under a one-to-one mapping of derived to true
// sessions, built greedily from the largest overlaps. Greedy matching never
// beats the best one-to-one mapping, so this is a lower bound on agreement
// under the best mapping.
func agreement(derived, truth []string) float64 {
	type pair struct{ d, t string }
	overlap := map[pair]int{}
	for i := range derived {
		overlap[pair{derived[i], truth[i]}]++
	}
	type entry struct {
		p pair
		n int
	}
	var entries []entry
	for p, n := range overlap {
		entries = append(entries, entry{p, n})
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.p.d, b.p.d), cmp.Compare(a.p.t, b.p.t))
	})
	usedD, usedT := map[string]bool{}, map[string]bool{}
	matched := 0
	for _, e := range entries {
		if usedD[e.p.d] || usedT[e.p.t] {
			continue
		}
		usedD[e.p.d], usedT[e.p.t] = true, true
		matched += e.n
	}
	return float64(matched) / float64(len(derived))
}

func TestAgreement(t *testing.T) {
	if got := agreement([]string{"a", "a", "b", "c"}, []string{"x", "x", "x", "y"}); got != 0.75 {
		t.Errorf("agreement = %v, want 0.75", got)
	}
}

// TestDeriveSessionsSynthetic strips the sessions of generated workloads and
// measures how well DeriveSessions recovers them.
func TestDeriveSessionsSynthetic(t *testing.T) {
	tests := []struct {
		preset string
		min    float64
	}{
		{"artchat", 0.95},
		// Short prompts often fit in one partial block, whose id the next
		// turn does not repeat, so block chains cannot link those turns.
		{"chat", 0.80},
		{"agent", 0.88},
	}
	for _, tt := range tests {
		reqs, err := Generate(GenConfig{Preset: tt.preset, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		truth := make([]string, len(reqs))
		for i := range reqs {
			truth[i], reqs[i].Session, reqs[i].Turn = reqs[i].Session, "", 0
		}
		n := DeriveSessions(reqs)
		derived := make([]string, len(reqs))
		for i := range reqs {
			derived[i] = reqs[i].Session
		}
		got := agreement(derived, truth)
		t.Logf("%s seed 1: %d true sessions, %d derived, agreement %.4f over %d requests",
			tt.preset, len(slices.Compact(slices.Sorted(slices.Values(truth)))), n, got, len(reqs))
		if got < tt.min {
			t.Errorf("%s: agreement %.4f < %.2f", tt.preset, got, tt.min)
		}
	}
}

func TestDeriveSessionsMooncake(t *testing.T) {
	reqs := readMooncake(t)
	sessions := map[string]bool{}
	for _, r := range reqs {
		sessions[r.Session] = true
	}
	const want = 8128
	if len(sessions) != want {
		t.Errorf("Mooncake trace: %d derived sessions, want %d", len(sessions), want)
	}
	if n := DeriveSessions(reqs); n != want {
		t.Errorf("DeriveSessions = %d, want %d", n, want)
	}
}
