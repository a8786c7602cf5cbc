package policy

import "testing"

func TestSkyWalker(t *testing.T) {
	sky := Options{Region: "us"}
	regions := func(r []Replica) {
		r[0].Region, r[1].Region, r[2].Region = "us", "eu", "ap"
	}
	// Local and not busy: stays local, even with the prefix elsewhere.
	reps := with(fleet(37, 279, 456), func(r []Replica) { regions(r); r[0].InFlight = 3; r[1].CachedTokens = 512 })
	if i, _ := decide(t, "skywalker", sky, exact, Request{PromptTokens: 1000}, reps, 1); i != 0 {
		t.Errorf("local replica under the threshold: chose %d", i)
	}
	// Local busy (4 pending): to the least pending prefix holder elsewhere.
	reps = with(fleet(37, 279, 456), func(r []Replica) {
		regions(r)
		r[0].InFlight = 6 // 6 pending
		r[1].InFlight, r[1].CachedTokens = 2, 512
		r[2].InFlight = 0
	})
	if i, _ := decide(t, "skywalker", sky, exact, Request{PromptTokens: 1000}, reps, 1); i != 1 {
		t.Errorf("local busy, prefix in eu: chose %d", i)
	}
	// Local busy, nobody holds the prefix: the least pending anywhere.
	reps = with(fleet(37, 279, 456), func(r []Replica) {
		regions(r)
		r[0].InFlight, r[0].Decoding = 10, 2 // 8 pending
		r[1].InFlight = 5
		r[2].InFlight = 1
	})
	if i, _ := decide(t, "skywalker", sky, exact, Request{PromptTokens: 1000}, reps, 1); i != 2 {
		t.Errorf("local busy, no prefix anywhere: chose %d", i)
	}
	// Requests decoding are not pending: local stays.
	reps = with(fleet(37, 279, 456), func(r []Replica) { regions(r); r[0].InFlight, r[0].Decoding = 20, 18 })
	if i, _ := decide(t, "skywalker", sky, exact, Request{PromptTokens: 1000}, reps, 1); i != 0 {
		t.Errorf("local decoding but not pending: chose %d", i)
	}
}
