package mesh

import (
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// A short bus blip at the router whose requests are mirrored: the events it
// publishes meanwhile are buffered and delivered when it is back, so the
// other router keeps no phantom load (found in review: they were dropped,
// and the mirrors stayed until RemoteTTL).
func TestOriginBlipLeavesNoPhantomLoad(t *testing.T) {
	url := natsServer(t)
	cut := newCutter(t, url[len("nats://"):])
	rA, rB := newRouter(t), newRouter(t)
	now := func() time.Duration { return 0 }
	hb := 300 * time.Millisecond
	a, err := Connect(Config{URL: cut.url(), Name: "us", Heartbeat: hb}, rA, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Connect(Config{URL: url, Name: "eu", Heartbeat: hb}, rB, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	req := policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2, 3, 4}}
	for id := uint64(1); id <= 3; id++ {
		a.Dispatched(id, "a", 0, &req)
	}
	eventually(t, "mirrors", func() bool { return b.Mirrors() == 3 })
	cut.cut(true)
	eventually(t, "us down", func() bool { return !a.Connected() })
	for id := uint64(1); id <= 3; id++ {
		a.Finished(id, 0, 0) // the requests end while us is off the bus: dropped
	}
	cut.restore()
	eventually(t, "us back", a.Connected)
	time.Sleep(8 * hb) // well past 5 heartbeats
	n, _ := inFlight(t, rB, "a")
	t.Logf("after the blip and %v: eu mirrors %d, replica a in flight at eu %d (all 3 ended at us)", 8*hb, b.Mirrors(), n)
	if n != 0 {
		t.Errorf("phantom in-flight at eu: %d (kept until remote_ttl, 10 min by default)", n)
	}
}

// A message the NATS client dequeued before Close is delivered after it
// (nats.go waitForMsgs reads s.closed with the dequeue, then calls mcb
// outside the lock): the mirror is entered after Close's forgetAll and never
// released.
func TestNothingIsMirroredAfterClose(t *testing.T) {
	url := natsServer(t)
	rB := newRouter(t)
	b, err := Connect(Config{URL: url, Name: "eu"}, rB, func() time.Duration { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	data, _ := json.Marshal(event{Router: "us", Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Blocks: []uint64{1}})
	b.receive(&nats.Msg{Data: data}) // the in-flight callback
	n, _ := inFlight(t, rB, "a")
	t.Logf("after Close: mirrors %d, in flight at a %d", b.Mirrors(), n)
	if n != 0 {
		t.Errorf("ledger leak after Close: %d in flight", n)
	}
}

// A router is judged quiet by its own heartbeat, not the receiver's: a
// receiver that beats every 50 ms keeps the mirrors of one that beats
// every second well past five of its own beats.
func TestQuietIsTheSendersHeartbeat(t *testing.T) {
	url := natsServer(t)
	rA, rB := newRouter(t), newRouter(t)
	now := func() time.Duration { return 0 }
	a, err := Connect(Config{URL: url, Name: "us", Heartbeat: time.Second}, rA, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Connect(Config{URL: url, Name: "eu", Heartbeat: 50 * time.Millisecond}, rB, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.Dispatched(1, "a", 0, &policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2}})
	deadline := time.Now().Add(10 * time.Second)
	for b.Mirrors() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("eu never mirrored us's request")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(600 * time.Millisecond) // twelve of eu's beats, under one of us's
	if b.Mirrors() != 1 {
		t.Errorf("eu dropped the mirror of a router that is not quiet: %d left", b.Mirrors())
	}
}

// Two routers under one name cannot tell each other's requests from their
// own: each says so, once, and mirrors nothing of the other's.
func TestTwoRoutersOfOneName(t *testing.T) {
	url := natsServer(t)
	var logA strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logA, mu: &mu}, nil))
	rA, rB := newRouter(t), newRouter(t)
	now := func() time.Duration { return 0 }
	a, err := Connect(Config{URL: url, Name: "us-ashburn"}, rA, now, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Connect(Config{URL: url, Name: "us-ashburn"}, rB, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	req := policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2}}
	for id := range uint64(3) {
		b.Dispatched(id+1, "a", 0, &req)
	}
	logged := func() string { mu.Lock(); defer mu.Unlock(); return logA.String() }
	eventually(t, "a to say another router has its name", func() bool { return strings.Contains(logged(), "has this router's name") })
	// A third router's request, sent once the server has the namesake's
	// three, reaches a after them: once a mirrors it, a has read them all.
	if err := b.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	join(t, url, "us-ashburn-2", newRouter(t)).Dispatched(1, "a", 0, &req)
	eventually(t, "a to mirror the third router's request", func() bool { n, _ := inFlight(t, rA, "a"); return n == 1 })
	if n := strings.Count(logged(), "has this router's name"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logged())
	}
	if n, _ := inFlight(t, rA, "a"); n != 1 {
		t.Errorf("a mirrored %d requests, want the third router's alone, none of its namesake's", n)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Routers of one region get names of their own by default: the host's.
func TestDefaultName(t *testing.T) {
	h, err := os.Hostname()
	if err != nil || h == "" {
		t.Skip("no host name here")
	}
	if got := DefaultName("us-ashburn"); got != "us-ashburn/"+h {
		t.Errorf("DefaultName = %q, want us-ashburn/%s", got, h)
	}
}

// A router whose bus is not up yet starts anyway, routes alone, and joins
// the mesh once the server is there.
func TestStartsBeforeTheBus(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a free port, nothing listening yet
	rA, rB := newRouter(t), newRouter(t)
	now := func() time.Duration { return 0 }
	a, err := Connect(Config{URL: "nats://" + addr, Name: "us"}, rA, now, nil)
	if err != nil {
		t.Fatalf("no bus yet: %v", err)
	}
	defer a.Close()
	if a.Connected() {
		t.Fatal("connected to nothing")
	}
	req := policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2}}
	if _, err := rA.Decide(0, &req, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatalf("cannot route without the bus: %v", err)
	}
	url, stop, err := Serve(addr)
	if err != nil {
		if probe, lerr := net.Listen("tcp", addr); lerr != nil {
			t.Skipf("the free port %s was taken by another process meanwhile (%v): cannot start the bus where the router looks for it", addr, err)
		} else {
			probe.Close()
		}
		t.Fatal(err)
	}
	defer stop()
	b, err := Connect(Config{URL: url, Name: "eu"}, rB, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	eventually(t, "us to reach the bus", a.Connected)
	if err := a.Conn().Flush(); err != nil { // its subscription is in place
		t.Fatal(err)
	}
	b.Dispatched(1, "a", 0, &req)
	eventually(t, "us to mirror eu's request", func() bool { n, _ := inFlight(t, rA, "a"); return n == 1 })
	if _, err := Connect(Config{URL: "nats://[::1", Name: "x"}, newRouter(t), now, nil); err == nil {
		t.Error("a URL that cannot work accepted")
	}
}

// A charge to a tenant's budgets made at one router is applied at the
// others, not at itself.
func TestChargesAreShared(t *testing.T) {
	url := natsServer(t)
	now := func() time.Duration { return 0 }
	a, err := Connect(Config{URL: url, Name: "us"}, newRouter(t), now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Connect(Config{URL: url, Name: "eu"}, newRouter(t), now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var mu sync.Mutex
	got := map[string][]float64{}
	record := func(who string) func(string, float64, float64) {
		return func(tenant string, requests, tokens float64) {
			mu.Lock()
			defer mu.Unlock()
			got[who] = append(got[who], requests, tokens)
			if tenant != "team" {
				t.Errorf("tenant %q", tenant)
			}
		}
	}
	a.OnCharge(record("us"))
	b.OnCharge(record("eu"))
	a.Charged("team", 1, 400)
	a.Charged("team", 0, -150)
	eventually(t, "eu to apply us's charges", func() bool { mu.Lock(); defer mu.Unlock(); return len(got["eu"]) == 4 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got["eu"], []float64{1, 400, 0, -150}) || len(got["us"]) != 0 {
		t.Errorf("applied %v", got)
	}
}

// A batch's dispatch carries where its prompts' chains end: the mirror
// credits each prompt's cached blocks, as its router did. Ends that are
// not a batch's are read as one prompt's.
func TestBatchDispatchCarriesItsChains(t *testing.T) {
	url := natsServer(t)
	rB := newRouter(t)
	b := join(t, url, "eu", rB)
	held := policy.Request{PromptTokens: 32, Blocks: []uint64{10, 11}}
	tk, _ := rB.Enter(0, "a", &held, router.OutputKeys{}, router.Origin{})
	rB.Accepted(&tk, &held)
	rB.Finish(&tk)
	for i, c := range []struct {
		ends    []int
		backlog int
	}{
		{[]int{2, 4}, 64 - 16}, // the second prompt's full block is held at a
		{[]int{2, 9}, 64},      // past the blocks: one prompt, held nowhere
		{[]int{3, 2, 4}, 64},   // decreasing
	} {
		data, _ := json.Marshal(event{Router: "us", Kind: kindDispatch, ID: uint64(i + 1), Replica: "a", Prompt: 64, Blocks: []uint64{1, 2, 10, 11}, BlockEnds: c.ends})
		b.receive(&nats.Msg{Data: data})
		st, _ := rB.Replica("a")
		if st.BacklogTokens != c.backlog {
			t.Errorf("ends %v: mirror's backlog %d tokens, want %d", c.ends, st.BacklogTokens, c.backlog)
		}
		end, _ := json.Marshal(event{Router: "us", Kind: kindEnd, ID: uint64(i + 1)})
		b.receive(&nats.Msg{Data: end})
	}
}

// A client's abort at one router is applied at the others, at when it was
// received there (or when heard, if that is earlier); a body over
// maxAbortBody is not sent.
func TestAbortsAreShared(t *testing.T) {
	url := natsServer(t)
	a := join(t, url, "us", newRouter(t))
	b := join(t, url, "eu", newRouter(t))
	type heard struct {
		body string
		at   time.Time
	}
	var mu sync.Mutex
	var got []heard
	b.OnAbort(func(body []byte, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, heard{string(body), at})
	})
	a.OnAbort(func([]byte, time.Time) { t.Error("a router heard its own abort") })
	at := time.Now().Add(-time.Second)
	if !a.Aborted([]byte(`{"rid":"r1"}`), at) {
		t.Fatal("not sent")
	}
	if a.Aborted(make([]byte, maxAbortBody+1), at) || a.Aborted(nil, at) {
		t.Error("an abort over the bound, or empty, was sent")
	}
	a.Aborted([]byte(`{"abort_all":true}`), time.Now().Add(time.Hour)) // a clock ahead
	eventually(t, "eu to hear us's aborts", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if got[0].body != `{"rid":"r1"}` || !got[0].at.Equal(time.Unix(0, at.UnixNano())) {
		t.Errorf("first abort heard as %+v, want r1 at %v", got[0], at)
	}
	if got[1].body != `{"abort_all":true}` || got[1].at.After(time.Now()) {
		t.Errorf("an abort from a clock ahead heard as %+v, want it at the hearing", got[1])
	}
}

// A client's flush of a replica's cache through one router empties the
// others' index of that replica too (2026-12-06: they routed for hits
// the flush had taken away, until their own answers corrected them).
func TestFlushesAreShared(t *testing.T) {
	url := natsServer(t)
	a := join(t, url, "us", newRouter(t))
	rB := newRouter(t)
	join(t, url, "eu", rB)
	for _, id := range []string{"a", "b"} {
		held := policy.Request{PromptTokens: 32, Blocks: []uint64{10, 11}}
		tk, _ := rB.Enter(0, id, &held, router.OutputKeys{}, router.Origin{})
		rB.Accepted(&tk, &held)
		rB.Finish(&tk)
	}
	blocks := func(id string) int { st, _ := rB.Replica(id); return st.IndexBlocks }
	if blocks("a") == 0 || blocks("b") == 0 {
		t.Fatalf("eu holds %d blocks at a, %d at b; want some at each", blocks("a"), blocks("b"))
	}
	a.Flushed("a")
	a.Flushed("gone") // a replica eu does not have
	eventually(t, "eu to forget a's blocks", func() bool { return blocks("a") == 0 })
	if blocks("b") == 0 {
		t.Error("eu forgot b's blocks too")
	}
}

// A replica put to sleep through one router is passed over by the others
// too, until woken (2026-12-06: they sent it requests it could not serve).
func TestSleepIsShared(t *testing.T) {
	url := natsServer(t)
	a := join(t, url, "us", newRouter(t))
	rB := newRouter(t)
	join(t, url, "eu", rB)
	asleep := func(id string) bool { st, _ := rB.Replica(id); return st.Asleep }
	a.Slept("a", true)
	a.Slept("gone", true) // a replica eu does not have
	eventually(t, "eu to hear a sleeps", func() bool { return asleep("a") })
	if st, _ := rB.Replica("a"); st.Available() || asleep("b") {
		t.Error("a sleeping replica available, or b asleep too")
	}
	a.Slept("a", false)
	eventually(t, "eu to hear a woke", func() bool { return !asleep("a") })
}
