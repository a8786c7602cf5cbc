package route

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func views(healthy ...bool) []Replica {
	reps := make([]Replica, len(healthy))
	for i, h := range healthy {
		reps[i] = Replica{ID: string(rune('a' + i)), Healthy: h}
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
		b.WriteString(reps[d.Replica].ID)
	}
	return b.String()
}

func TestRoundRobin(t *testing.T) {
	cases := []struct {
		reps []Replica
		want string
	}{
		{views(true, true, true), "abcabca"},
		{views(true, false, true), "acacaca"},
		{views(false, false, true), "ccccccc"},
	}
	for _, c := range cases {
		p, _ := New("round-robin", Options{})
		if got := picks(t, p, c.reps, 7); got != c.want {
			t.Errorf("picks %s, want %s", got, c.want)
		}
	}
}

func TestRandomSpreadsOverHealthy(t *testing.T) {
	p, _ := New("random", Options{})
	got := picks(t, p, views(true, false, true), 3000)
	na, nc := strings.Count(got, "a"), strings.Count(got, "c")
	if strings.Contains(got, "b") || na < 1400 || nc < 1400 {
		t.Errorf("a %d, c %d, b %d", na, nc, strings.Count(got, "b"))
	}
}

func TestUnknownPolicyListsValid(t *testing.T) {
	_, err := New("fastest", Options{})
	if err == nil || !strings.Contains(err.Error(), "round-robin") {
		t.Errorf("err = %v", err)
	}
}
