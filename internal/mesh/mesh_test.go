package mesh

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// natsServer runs an embedded NATS server for the test.
func natsServer(t testing.TB) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(ns.Shutdown)
	return ns.ClientURL()
}

// cutter is a TCP proxy to the NATS server whose connections can be cut.
type cutter struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

func newCutter(t *testing.T, target string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			if c.down {
				c.mu.Unlock()
				in.Close()
				continue
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				c.mu.Unlock()
				in.Close()
				continue
			}
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); c.cut(true) })
	return c
}

func (c *cutter) url() string { return "nats://" + c.ln.Addr().String() }

// cut closes every connection; down keeps new ones out until restore.
func (c *cutter) cut(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
	for _, cn := range c.conns {
		cn.Close()
	}
	c.conns = nil
}

func (c *cutter) restore() { c.mu.Lock(); c.down = false; c.mu.Unlock() }

func newRouter(t testing.TB) *router.Router {
	t.Helper()
	p, _ := policy.New("gorgo-ms", policy.Options{})
	rt, err := router.New(router.Config{Policy: p, BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 16, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}); err != nil {
			t.Fatal(err)
		}
		rt.ObserveRTT(id, 10*time.Millisecond)
	}
	return rt
}

// join connects rt to the bus at url as name, on a clock that stands
// still, until the test ends.
func join(t *testing.T, url, name string, rt *router.Router) *Bus {
	t.Helper()
	return joinWith(t, Config{URL: url, Name: name}, rt)
}

// joinWith connects a router to the bus with cfg.
func joinWith(t *testing.T, cfg Config, rt *router.Router) *Bus {
	t.Helper()
	b, err := Connect(cfg, rt, func() time.Duration { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stale reports whether b still ignores dispatches after a loss of events
// (see Bus.unsync).
func stale(b *Bus) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stale
}

func inFlight(t *testing.T, rt *router.Router, id string) (int, int) {
	st, err := rt.Replica(id)
	if err != nil {
		t.Fatal(err)
	}
	return st.InFlight, st.IndexBlocks
}

func TestMirrorsTheOthersRequests(t *testing.T) {
	url := natsServer(t)
	cut := newCutter(t, url[len("nats://"):])
	r1, r2 := newRouter(t), newRouter(t)
	now := func() time.Duration { return 0 }
	b1, err := Connect(Config{URL: url, Name: "us", Heartbeat: 200 * time.Millisecond}, r1, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b1.Close()
	b2, err := Connect(Config{URL: cut.url(), Name: "eu", Heartbeat: 50 * time.Millisecond}, r2, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	req := policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2, 3, 4}, PrefixKey: 5, SessionKey: "conversation"}
	b1.Dispatched(7, "a", 0, &req)
	eventually(t, "eu to mirror us's request", func() bool { n, _ := inFlight(t, r2, "a"); return n == 1 })
	if n, _ := inFlight(t, r1, "a"); n != 0 {
		t.Errorf("us mirrored its own request: %d in flight", n)
	}
	// The replica's 200 says it took the prompt: only then is it in eu's
	// prefix index.
	if _, blocks := inFlight(t, r2, "a"); blocks != 0 {
		t.Errorf("a credited with %d blocks before it took the request", blocks)
	}
	b1.Accepted(7)
	eventually(t, "the prompt in eu's index", func() bool { _, blocks := inFlight(t, r2, "a"); return blocks == 4 })
	b1.FirstToken(7)
	eventually(t, "the first token", func() bool {
		st, _ := r2.Replica("a")
		return st.Decoding == 1 && st.BacklogTokens == 0 && st.IndexBlocks == 4
	})
	before, _ := r2.Replica("a")
	b1.Finished(7, 41, 2*time.Second) // 40 gaps of 50 ms
	eventually(t, "the end", func() bool { n, _ := inFlight(t, r2, "a"); return n == 0 })
	// eu learns a's ITL from us's request too.
	if after, _ := r2.Replica("a"); after.ITLSamples != before.ITLSamples+1 {
		t.Errorf("ITL samples %d → %d, want one more from us's answer", before.ITLSamples, after.ITLSamples)
	}
	if b2.Mirrors() != 0 {
		t.Errorf("%d mirrors left", b2.Mirrors())
	}
	// An unknown replica is ignored; a duplicate dispatch too.
	b1.Dispatched(8, "zz", 0, &req)
	b1.Dispatched(9, "b", 0, &req)
	b1.Dispatched(9, "b", 0, &req)
	eventually(t, "the second request", func() bool { n, _ := inFlight(t, r2, "b"); return n == 1 })
	// eu loses the bus: it forgets what it mirrored and routes alone.
	cut.cut(true)
	eventually(t, "eu to forget", func() bool { n, _ := inFlight(t, r2, "b"); return n == 0 && !b2.Connected() })
	if _, err := r2.Decide(0, &req, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatalf("eu cannot route without the bus: %v", err)
	}
	// Back on the bus, it mirrors what comes next.
	cut.restore()
	eventually(t, "eu back on the bus", b2.Connected)
	eventually(t, "eu to hear its own mark: what was queued before the cut is behind it", func() bool { return !stale(b2) })
	b1.Dispatched(10, "a", 0, &req)
	eventually(t, "a mirror after the reconnect", func() bool { n, _ := inFlight(t, r2, "a"); return n == 1 })
	// A request for three answers is three sequences in eu's ledger too.
	three := req
	three.Choices = 3
	b1.Dispatched(11, "b", 0, &three)
	eventually(t, "the three answers' sequences", func() bool { n, _ := inFlight(t, r2, "b"); return n == 3 })
	// us goes quiet (its end never comes): eu drops its mirror.
	b1.Close()
	eventually(t, "eu to drop a quiet router's mirrors", func() bool {
		n, _ := inFlight(t, r2, "a")
		m, _ := inFlight(t, r2, "b")
		return n == 0 && m == 0
	})
}

// Every router learns answers' lengths from the others' answers, streamed
// or not, under the keys the sender computed from what it alone was sent
// (the application, the conversation): eu, which sent none of these
// requests, expects each application's answers at their own length.
func TestLearnsTheOthersAnswers(t *testing.T) {
	url := natsServer(t)
	r2 := newRouter(t)
	b1, b2 := join(t, url, "us", newRouter(t)), join(t, url, "eu", r2)
	const tools, reports = 11, 22
	for i := range uint64(200) {
		req := policy.Request{PromptTokens: 64, Blocks: []uint64{i + 1}, PrefixKey: tools, SessionKey: fmt.Sprint("t", i)}
		out := 40
		if i%2 == 1 {
			req.PrefixKey, req.SessionKey, out = reports, fmt.Sprint("r", i), 800
		}
		b1.Dispatched(i+1, "a", 0, &req)
		b1.Finished(i+1, out, 0) // not streamed: no decode time
	}
	eventually(t, "eu to hear every answer", func() bool {
		n, _ := inFlight(t, r2, "a")
		return n == 0 && b2.Mirrors() == 0 && r2.OutputEstimate().Keys == 202
	})
	tool, report := r2.ExpectedOutput(&policy.Request{PrefixKey: tools}), r2.ExpectedOutput(&policy.Request{PrefixKey: reports})
	if tool < 40 || tool > 60 || report < 750 || report > 800 {
		t.Errorf("eu expects tool calls at %d and reports at %d tokens, want about 40 and 800", tool, report)
	}
}

// A response stored at a replica is known to every router: a follow-up
// that names it, sent to another region's router, goes there too. A
// replica the receiver does not have is not recorded.
func TestRoutersShareStoredResponses(t *testing.T) {
	url := natsServer(t)
	rt := newRouter(t)
	us, _ := join(t, url, "us", newRouter(t)), join(t, url, "eu", rt)
	us.Stored("resp_1", "b")
	us.Stored("resp_2", "nowhere")
	eventually(t, "eu to learn where resp_1 is stored", func() bool { id, ok := rt.Holder("resp_1"); return ok && id == "b" })
	if id, ok := rt.Holder("resp_2"); ok {
		t.Errorf("resp_2 recorded at %s, a replica eu does not have", id)
	}
}
