package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// testLog is a logger whose lines a test can count.
type testLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *testLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&lockedWriter{w: &l.buf, mu: &l.mu}, nil))
}

func (l *testLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// bareBus is a bus on no connection, named "me", whose events a test
// hands it (apply) at the times it chooses.
func bareBus(t *testing.T, log *slog.Logger) (*Bus, *router.Router) {
	rt := newRouter(t)
	cfg := Config{Name: "me"}
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return newBus(cfg, rt, func() time.Duration { return 0 }, log), rt
}

// After a disconnect the NATS client delivers the events it had already
// queued: dispatches among them whose ends, published while the receiver
// was off the bus, it will never hear of. They must not be mirrored
// (found in review: they stayed until remote_ttl); what comes after the
// receiver's own mark, once it is back, is. The client's own callbacks are
// called as it calls them.
func TestEventsQueuedBeforeADisconnectAreNotMirrored(t *testing.T) {
	url := natsServer(t)
	rB := newRouter(t)
	// eu's heartbeats, which carry its mark while it is stale, only when
	// the test sends them (a timer's could end the resync too soon).
	us, eu := join(t, url, "us", newRouter(t)), joinWith(t, Config{URL: url, Name: "eu", Heartbeat: time.Minute}, rB)
	var charges atomic.Int64
	eu.OnCharge(func(string, float64, float64) { charges.Add(1) })
	req := policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2, 3, 4}}
	us.Dispatched(1, "a", 0, &req)
	eventually(t, "eu to mirror us's request", func() bool { return eu.Mirrors() == 1 })

	nc := eu.Conn()
	nc.Opts.DisconnectedErrCB(nc, errors.New("cut"))
	if n, _ := inFlight(t, rB, "a"); n != 0 || eu.Mirrors() != 0 {
		t.Fatalf("after the disconnect: %d mirrors, %d in flight at a", eu.Mirrors(), n)
	}
	// A dispatch delivered now stands for one queued before the cut (us's
	// events reach eu in order: once eu has the charge sent after it, it
	// has the dispatch).
	us.Dispatched(2, "a", 0, &req)
	us.Charged("team", 1, 0)
	eventually(t, "eu to hear us's charge", func() bool { return charges.Load() == 1 })
	if n, _ := inFlight(t, rB, "a"); n != 0 {
		t.Errorf("a dispatch delivered after the disconnect was mirrored: %d in flight at a", n)
	}

	nc.Opts.ReconnectedCB(nc)
	eventually(t, "eu to hear its own mark", func() bool { return !stale(eu) })
	us.Dispatched(3, "a", 0, &req)
	eventually(t, "eu to mirror us's requests again", func() bool { n, _ := inFlight(t, rB, "a"); return n == 1 })
}

// A slow consumer (the NATS client dropped events, ends among them) is
// handled as a disconnect: the mirrors are forgotten and no dispatch is
// mirrored until the router hears its own mark of the latest loss. It is
// logged once. The bus never reaches its server here: the test delivers
// what the client would.
func TestSlowConsumerForgetsUntilTheMark(t *testing.T) {
	var log testLog
	rt := newRouter(t)
	b, err := Connect(Config{URL: "nats://127.0.0.1:1", Name: "eu"}, rt, func() time.Duration { return 0 }, log.logger())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	deliver := func(e event) {
		data, _ := json.Marshal(&e)
		b.receive(&nats.Msg{Data: data})
	}
	dispatch := func(id uint64) {
		deliver(event{Router: "us", Boot: 1, Kind: kindDispatch, ID: id, Replica: "a", Prompt: 64, Blocks: []uint64{id}})
	}
	mark := func() uint64 { b.mu.Lock(); defer b.mu.Unlock(); return b.epoch }
	dispatch(1)
	if b.Mirrors() != 1 {
		t.Fatalf("%d mirrors, want 1", b.Mirrors())
	}
	nc := b.Conn()
	nc.Opts.AsyncErrorCB(nc, nil, nats.ErrSlowConsumer)
	if n, _ := inFlight(t, rt, "a"); n != 0 || b.Mirrors() != 0 {
		t.Fatalf("after a slow consumer: %d mirrors, %d in flight at a", b.Mirrors(), n)
	}
	dispatch(2) // queued before the drop
	old := mark()
	nc.Opts.AsyncErrorCB(nc, nil, nats.ErrSlowConsumer) // another drop
	deliver(event{Router: "eu", Boot: b.boot, Kind: kindAlive, Mark: old})
	dispatch(3) // queued before the second drop
	if n, _ := inFlight(t, rt, "a"); n != 0 {
		t.Errorf("dispatches delivered before the latest mark were mirrored: %d in flight at a", n)
	}
	deliver(event{Router: "eu", Boot: b.boot, Kind: kindAlive, Mark: mark()})
	dispatch(4)
	if n, _ := inFlight(t, rt, "a"); n != 1 {
		t.Errorf("after the mark: %d in flight at a, want 1", n)
	}
	if n := log.count("fell behind"); n != 1 {
		t.Errorf("slow consumers logged %d times, want once", n)
	}
}

// A router mirrors another's attempt in its prefix index only once that
// router reports the replica took it (a first token, a complete answer),
// as it does its own at the replica's 200 (found in review: every
// dispatch was credited, refused attempts too).
func TestOnlyAcceptedAttemptsEnterThePrefixIndex(t *testing.T) {
	b, rt := bareBus(t, nil)
	at := time.Now()
	send := func(e event) { e.Router, e.Boot = "us", 1; b.apply(&e, at) }

	// Refused (a 429, a connection error): dispatched, ended with no answer.
	send(event{Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Blocks: []uint64{11, 12, 13, 14}})
	send(event{Kind: kindEnd, ID: 1})
	if n, blocks := inFlight(t, rt, "a"); n != 0 || blocks != 0 {
		t.Errorf("after a refused attempt: a has %d in flight, %d blocks in the index; want none", n, blocks)
	}

	// Taken: credited when its router says the replica took it (the 200).
	send(event{Kind: kindDispatch, ID: 2, Replica: "a", Prompt: 64, Blocks: []uint64{21, 22, 23, 24}})
	if _, blocks := inFlight(t, rt, "a"); blocks != 0 {
		t.Errorf("credited at dispatch: %d blocks", blocks)
	}
	send(event{Kind: kindAccepted, ID: 2})
	if _, blocks := inFlight(t, rt, "a"); blocks != 4 {
		t.Errorf("after the replica took it: %d blocks, want 4", blocks)
	}
	send(event{Kind: kindFirst, ID: 2}) // credited once
	if _, blocks := inFlight(t, rt, "a"); blocks != 4 {
		t.Errorf("after the first token: %d blocks, want 4", blocks)
	}

	// From a router that sends no accepted event: at its first token.
	send(event{Kind: kindDispatch, ID: 4, Replica: "a", Prompt: 64, Blocks: []uint64{41, 42}})
	send(event{Kind: kindFirst, ID: 4})
	if _, blocks := inFlight(t, rt, "a"); blocks != 6 {
		t.Errorf("after the first token: %d blocks, want 6", blocks)
	}

	// Not streamed: credited when its complete answer is reported.
	send(event{Kind: kindDispatch, ID: 3, Replica: "b", Prompt: 48, Blocks: []uint64{31, 32, 33}, Unstreamed: true})
	send(event{Kind: kindEnd, ID: 3, Out: 40})
	if n, blocks := inFlight(t, rt, "b"); n != 0 || blocks != 3 {
		t.Errorf("after a complete answer: b has %d in flight, %d blocks; want 0 and 3", n, blocks)
	}
}

// Routers that come and go (pods rolled out under new names) or a
// publisher of made-up names are forgotten once not heard from for
// remote_ttl (found in review: they were remembered forever).
func TestQuietRoutersAreForgotten(t *testing.T) {
	b, rt := bareBus(t, nil)
	t0 := time.Now()
	for i := range maxPeers - 2 {
		b.apply(&event{Router: fmt.Sprintf("us/gorgo-%04d", i), Boot: uint64(i), Kind: kindAlive}, t0)
	}
	b.apply(&event{Router: "us/gorgo-a", Boot: 1, Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Blocks: []uint64{1}}, t0)
	later := t0.Add(b.cfg.RemoteTTL / 2)
	b.apply(&event{Router: "eu/gorgo-b", Boot: 1, Kind: kindAlive}, later)
	b.sweep(later)
	if len(b.peers) != maxPeers {
		t.Fatalf("%d routers remembered, want %d before remote_ttl", len(b.peers), maxPeers)
	}
	b.sweep(t0.Add(b.cfg.RemoteTTL + time.Second))
	if len(b.peers) != 1 || b.peers["eu/gorgo-b"] == nil {
		t.Errorf("after remote_ttl: %d routers remembered, want eu/gorgo-b alone", len(b.peers))
	}
	if n, _ := inFlight(t, rt, "a"); n != 0 {
		t.Errorf("a forgotten router's request still in flight: %d", n)
	}
}

// At most maxPeers routers are tracked: a new one takes the place of a
// quiet one, and is not mirrored while every place is held by a router
// still heard from (logged once).
func TestRoutersAreBounded(t *testing.T) {
	var log testLog
	b, rt := bareBus(t, log.logger())
	t0 := time.Now()
	for i := range maxPeers {
		b.apply(&event{Router: fmt.Sprint("r", i), Boot: 1, Kind: kindAlive, Heartbeat: 1000}, t0)
	}
	dispatch := func(name string, at time.Time) {
		b.apply(&event{Router: name, Boot: 1, Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Blocks: []uint64{1}}, at)
	}
	soon := t0.Add(time.Second) // none quiet: five heartbeats are 5 s
	dispatch("new-1", soon)
	dispatch("new-2", soon)
	if n, _ := inFlight(t, rt, "a"); n != 0 || len(b.peers) != maxPeers {
		t.Errorf("with %d routers heard from: %d tracked, %d mirrored", maxPeers, len(b.peers), n)
	}
	if n := log.count("too many routers"); n != 1 {
		t.Errorf("a full table logged %d times, want once", n)
	}
	dispatch("new-1", t0.Add(6*time.Second)) // they are all quiet now
	if n, _ := inFlight(t, rt, "a"); n != 1 || len(b.peers) != maxPeers || b.peers["new-1"] == nil {
		t.Errorf("a new router in a quiet one's place: %d tracked, %d mirrored", len(b.peers), n)
	}
}

// At most maxMirrorsPerPeer of one router's requests are mirrored at once
// (logged once); another router's still are.
func TestMirrorsPerRouterAreBounded(t *testing.T) {
	var log testLog
	b, rt := bareBus(t, log.logger())
	at := time.Now()
	dispatch := func(router string, id uint64) {
		b.apply(&event{Router: router, Boot: 1, Kind: kindDispatch, ID: id, Replica: "a", Prompt: 16, Blocks: []uint64{id}}, at)
	}
	for id := range uint64(maxMirrorsPerPeer + 10) {
		dispatch("us", id+1)
	}
	if n, _ := inFlight(t, rt, "a"); n != maxMirrorsPerPeer || b.Mirrors() != maxMirrorsPerPeer {
		t.Errorf("%d mirrors, %d in flight at a; want %d", b.Mirrors(), n, maxMirrorsPerPeer)
	}
	if n := log.count("too many requests in flight"); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	b.apply(&event{Router: "us", Boot: 1, Kind: kindEnd, ID: 1}, at)
	dispatch("us", maxMirrorsPerPeer+100) // room again
	dispatch("eu", 1)
	if n, _ := inFlight(t, rt, "a"); n != maxMirrorsPerPeer+1 {
		t.Errorf("%d in flight at a, want %d", n, maxMirrorsPerPeer+1)
	}
}

// A mirror keeps at most maxMirrorBlocks of its prompt's blocks until its
// replica takes it, and all mirrors at most maxHeldBlocks (found in review:
// a peer's dispatches of huge prompts, never accepted, kept their blocks
// for remote_ttl, whatever their number).
func TestMirroredBlocksAreBounded(t *testing.T) {
	b, rt := bareBus(t, nil)
	at := time.Now()
	huge := make([]uint64, 2*maxMirrorBlocks)
	for i := range huge {
		huge[i] = uint64(i + 1)
	}
	n := maxHeldBlocks/maxMirrorBlocks + 3
	for id := range uint64(n) {
		b.apply(&event{Router: "us", Boot: 1, Kind: kindDispatch, ID: id + 1, Replica: "a", Prompt: len(huge) * 16, Blocks: huge}, at)
	}
	b.mu.Lock()
	held := b.heldBlocks
	b.mu.Unlock()
	if held != maxHeldBlocks {
		t.Errorf("the mirrors hold %d blocks, want the bound %d", held, maxHeldBlocks)
	}
	if m, _ := inFlight(t, rt, "a"); m != n {
		t.Errorf("%d mirrors in a's ledger, want all %d (the blocks are bounded, not the mirrors)", m, n)
	}
	b.apply(&event{Router: "us", Boot: 1, Kind: kindAccepted, ID: 1}, at)
	if _, blocks := inFlight(t, rt, "a"); blocks == 0 || blocks > maxMirrorBlocks { // its share of the index may hold fewer
		t.Errorf("a credited with %d blocks, want some of the first %d", blocks, maxMirrorBlocks)
	}
	b.apply(&event{Router: "us", Boot: 1, Kind: kindReset}, at)
	b.mu.Lock()
	held = b.heldBlocks
	b.mu.Unlock()
	if held != 0 {
		t.Errorf("%d blocks held after the mirrors were forgotten", held)
	}
}

// Another router's request for a LoRA adapter holds the adapter at its
// replica here too, as it does there: a mirror carries the request's
// model (2026-12-05: it carried none, and each router saw only its own
// requests' adapters until the next scrape, so they disagreed on which
// were loaded and which slots were free).
func TestMirroredRequestsHoldTheirAdapter(t *testing.T) {
	b, rt := bareBus(t, nil)
	set, err := models.WithAdapters([]string{"m"}, []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.SetModels("a", set); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	send := func(e event) { e.Router, e.Boot = "us", 1; b.apply(&e, at) }
	send(event{Kind: kindDispatch, ID: 1, Replica: "a", Prompt: 64, Model: "x"})
	st, _ := rt.Replica("a")
	if !slices.Equal(st.Adapters.Resident, []string{"x"}) || !slices.Equal(st.Adapters.InFlight, []int{1}) {
		t.Errorf("a mirrored request for adapter x in flight: resident %v, in flight %v; want [x] [1]", st.Adapters.Resident, st.Adapters.InFlight)
	}
	send(event{Kind: kindEnd, ID: 1})
	st, _ = rt.Replica("a")
	if !slices.Equal(st.Adapters.Resident, []string{"x"}) || !slices.Equal(st.Adapters.InFlight, []int{0}) {
		t.Errorf("after its end: resident %v, in flight %v; want [x] [0]", st.Adapters.Resident, st.Adapters.InFlight)
	}
	// A name longer than any served is not read.
	send(event{Kind: kindDispatch, ID: 2, Replica: "a", Prompt: 64, Model: strings.Repeat("x", maxModelName+1)})
	if n, _ := inFlight(t, rt, "a"); n != 1 {
		t.Errorf("a dispatch with an overlong model: %d in flight, want it mirrored (as the base's)", n)
	}
}
