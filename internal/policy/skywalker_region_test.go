package policy

import "testing"

// With no region no replica is local (newSkyWalker's promise): a router
// without a region over replicas without one balances pending work,
// prefix holders first, rather than taking every replica for local and
// sending the request to the longest prefix however busy.
func TestSkyWalkerWithoutRegion(t *testing.T) {
	reps := with(fleet(10, 10), func(r []Replica) {
		r[0].InFlight, r[0].CachedTokens = 3, 512 // 3 pending, longest prefix
		r[1].InFlight, r[1].CachedTokens = 0, 256 // idle, holds part of it
	})
	if i, _ := decide(t, "skywalker", Options{}, exact, Request{PromptTokens: 1000}, reps, 1); i != 1 {
		t.Errorf("no region: chose %d, want 1 (the least pending prefix holder)", i)
	}
}
