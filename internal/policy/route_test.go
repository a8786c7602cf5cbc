package policy

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func views(n int) []Replica {
	reps := make([]Replica, n)
	for i := range reps {
		reps[i] = Replica{ID: string(rune('a' + i))}
	}
	return reps
}

func picks(t *testing.T, p Policy, reps []Replica, n int) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var d Decision
	var b strings.Builder
	for range n {
		if err := p.Decide(&d, &Request{}, reps, rng); err != nil {
			t.Fatal(err)
		}
		b.WriteString(reps[Pick(&d, DefaultTieMargin, rng)].ID)
	}
	return b.String()
}

func TestRoundRobin(t *testing.T) {
	p, _ := New("round-robin", Options{})
	if got := picks(t, p, views(3), 7); got != "abcabca" {
		t.Errorf("picks %s, want abcabca", got)
	}
	// Its fallbacks are the next replicas in turn.
	var d Decision
	_ = p.Decide(&d, &Request{}, views(3), nil)
	if d.Replica != 1 || d.Scores[2].Total != 1 || d.Scores[0].Total != 2 {
		t.Errorf("decision %+v: want b, then c, then a", d)
	}
}

func TestRandomSpreads(t *testing.T) {
	p, _ := New("random", Options{})
	got := picks(t, p, views(2), 3000)
	if na, nb := strings.Count(got, "a"), strings.Count(got, "b"); na < 1400 || nb < 1400 {
		t.Errorf("a %d, b %d", na, nb)
	}
}

func TestRegistry(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a second gorgo registered")
		}
	}()
	if _, ok := Lookup("gorgo"); !ok {
		t.Fatal("gorgo is not registered")
	}
	Register(Info{Name: "gorgo", New: newGorgo})
}

func TestUnknownPolicyListsValid(t *testing.T) {
	_, err := New("fastest", Options{})
	if err == nil || !strings.Contains(err.Error(), "round-robin") {
		t.Errorf("err = %v", err)
	}
}
