package mesh

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// A peer's dispatch names its prompt's length, and the mirror charges it to
// the replica's ledger as is: a negative or huge count from a buggy or
// hostile peer makes the replica's unfinished work and prefill backlog
// negative (two dispatches of 2^62 tokens wrap the backlog to -2^63), so
// that a loaded replica looks emptier than an idle one and draws every
// request until the mirrors end (remote_ttl, 10 min, if they never do).
// Such a dispatch is ignored, as Choices is bounded (2026-12-05: the
// prompt's length was not).
func TestPeerPromptLengthIsBounded(t *testing.T) {
	b, rt := bareBus(t, nil)
	at := time.Now()
	pick := func(block uint64) string {
		c, err := rt.Decide(0, &policy.Request{PromptTokens: 500, Blocks: []uint64{block}}, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	// us has 20 long prompts in flight at b: a, idle, is the choice.
	for id := range uint64(20) {
		b.apply(&event{Router: "us", Boot: 1, Kind: kindDispatch, ID: id + 1, Replica: "b", Prompt: 4000, Blocks: []uint64{id + 100}}, at)
	}
	if got := pick(9001); got != "a" {
		t.Fatalf("before: picked %q, want idle a", got)
	}
	// A hostile (or corrupted) router: one negative prompt, two that wrap.
	b.apply(&event{Router: "eu", Boot: 1, Kind: kindDispatch, ID: 1, Replica: "a", Prompt: -1 << 40}, at)
	b.apply(&event{Router: "eu", Boot: 1, Kind: kindDispatch, ID: 2, Replica: "b", Prompt: 1 << 62}, at)
	b.apply(&event{Router: "eu", Boot: 1, Kind: kindDispatch, ID: 3, Replica: "b", Prompt: 1 << 62}, at)
	for _, id := range []string{"a", "b"} {
		st, err := rt.Replica(id)
		if err != nil {
			t.Fatal(err)
		}
		if st.UnfinishedTokens < 0 || st.BacklogTokens < 0 {
			t.Errorf("replica %s: unfinished %d, backlog %d tokens after a peer's dispatches: negative load", id, st.UnfinishedTokens, st.BacklogTokens)
		}
	}
	if got := pick(9002); got != "a" {
		t.Errorf("after a peer's bogus prompt lengths: picked %q, loaded (and now wrapped) over idle a", got)
	}
}

// A router's heartbeat period is taken as it says, up to MaxHeartbeat: a
// made-up one neither overflows the quiet check (found in review) nor
// keeps a silent router's mirrors for as long as the router is remembered
// (a period of 2^40 ms kept them for 35 years).
func TestPeerHeartbeatIsBounded(t *testing.T) {
	b, rt := bareBus(t, nil)
	t0 := time.Now()
	for i, hb := range []int64{math.MaxInt64, math.MaxInt64 / 1000, 1 << 40} {
		name := fmt.Sprint("r", i)
		b.apply(&event{Router: name, Boot: 1, Kind: kindAlive, Heartbeat: hb}, t0)
		b.apply(&event{Router: name, Boot: 1, Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Heartbeat: hb}, t0)
	}
	b.sweep(t0.Add(time.Second))
	if n, _ := inFlight(t, rt, "a"); n != 3 {
		t.Errorf("a second after their dispatches: %d of 3 mirrored requests kept", n)
	}
	b.sweep(t0.Add(b.cfg.RemoteTTL/2 + time.Second)) // quiet, not yet forgotten
	if n, _ := inFlight(t, rt, "a"); n != 0 || len(b.peers) != 3 {
		t.Errorf("after silences of half remote_ttl: %d mirrored requests kept, %d routers known; want 0 and 3", n, len(b.peers))
	}
}

// A router's own heartbeat is at most MaxHeartbeat, which every router
// takes as the bound of another's.
func TestHeartbeatIsBounded(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{URL: "nats://x", Name: "n"}, true},
		{Config{URL: "nats://x", Name: "n", Heartbeat: time.Minute, RemoteTTL: 10 * time.Minute}, true},
		{Config{URL: "nats://x", Name: "n", Heartbeat: 2 * time.Minute, RemoteTTL: 10 * time.Minute}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.cfg, err, c.ok)
		}
	}
}

// Routers' configs may differ (remote_ttl 10m and heartbeat 1m; remote_ttl
// 1m): a router on schedule is not quiet to another whatever that one's
// remote_ttl (found in review: bounded by a tenth of the hearer's
// remote_ttl, a 1-minute period was taken as 6 s, and the router's
// requests were forgotten 30 s into each minute).
func TestPeerOnScheduleIsNotQuiet(t *testing.T) {
	rt := newRouter(t)
	cfg := Config{Name: "b", RemoteTTL: time.Minute}
	cfg.defaults()
	b := newBus(cfg, rt, func() time.Duration { return 0 }, slog.New(slog.DiscardHandler))
	hb := time.Minute.Milliseconds()
	t0 := time.Now()
	b.apply(&event{Router: "a", Boot: 1, Kind: kindAlive, Heartbeat: hb}, t0)
	b.apply(&event{Router: "a", Boot: 1, Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Heartbeat: hb}, t0)
	b.sweep(t0.Add(31 * time.Second)) // A's next heartbeat is due at 60 s
	if n, _ := inFlight(t, rt, "a"); n != 1 {
		t.Errorf("31 s into A's 60 s heartbeat period: %d of its 1 request kept", n)
	}
}

// A router's name is what the others keep it under until it goes quiet:
// an event under a name longer than maxRouterName is not heard, and a
// router's own is refused at its config (2026-12-07, a review: 256
// heartbeats under names of 1 MiB each, NATS's largest payload, kept 256
// MiB until remote_ttl). An abort's body longer than a router sends is
// not heard either.
func TestPeerNameIsBounded(t *testing.T) {
	b, _ := bareBus(t, nil)
	hear := func(e event) {
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b.receive(&nats.Msg{Data: data})
	}
	hear(event{Router: strings.Repeat("n", maxRouterName+1), Boot: 1, Kind: kindAlive})
	if n := len(b.peers); n != 0 {
		t.Errorf("a router named with %d bytes was heard (%d routers known)", maxRouterName+1, n)
	}
	hear(event{Router: strings.Repeat("n", maxRouterName), Boot: 1, Kind: kindAlive})
	if n := len(b.peers); n != 1 {
		t.Errorf("a router named with %d bytes: %d routers known, want 1", maxRouterName, n)
	}
	hear(event{Router: "other", Boot: 1, Kind: kindAbort, Abort: strings.Repeat("x", maxAbortBody+1)})
	if n := len(b.peers); n != 1 {
		t.Errorf("an abort longer than a router sends was heard (%d routers known)", n)
	}
	cfg := Config{URL: "nats://x", Name: strings.Repeat("n", maxRouterName+1)}
	if err := cfg.Validate(); err == nil {
		t.Errorf("a name of %d bytes is taken", maxRouterName+1)
	}
}
