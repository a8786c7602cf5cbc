package admit

import (
	"slices"
	"testing"
	"time"
)

// fifo is a toy saturated fleet for flow control under sustained load: one
// queue of prompt tokens, drained at 10 tokens per ms; a request's forecast
// is the tokens ahead of it and its own at 0.1 ms each, its floor its own.
type fifo struct {
	queued   float64
	since    time.Duration // when served starts counting
	now      time.Duration
	served   map[string]int // tokens sent since since, by tenant
	refused  map[string]int // requests refused, by tenant
	offered  map[string]int // requests, by tenant
	predicts int
}

type job struct {
	tenant string
	tokens int
}

func (f *fifo) predict(j *job) (Prediction, bool) {
	f.predicts++
	return Prediction{Best: ms * time.Duration((f.queued+float64(j.tokens))/10), Floor: ms * time.Duration(float64(j.tokens)/10)}, true
}

func (f *fifo) dispatch(j *job) {
	f.queued += float64(j.tokens)
	if f.now >= f.since {
		f.served[j.tenant] += j.tokens
	}
}

func (f *fifo) refuse(j *job, _ Reason) { f.refused[j.tenant]++ }

// arrival is a request of class c, every `every` ms from ms 0.
type arrival struct {
	c     Class
	every int
}

// runFIFO runs a gate of config c over the toy fleet for a minute, the
// arrivals coming as given and the queue released every ms; it counts the
// tokens served from since on.
func runFIFO(t *testing.T, c Config, since time.Duration, arrivals ...arrival) *fifo {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	g := New[*job](c)
	f := &fifo{since: since, served: map[string]int{}, refused: map[string]int{}, offered: map[string]int{}}
	for step := range 60_000 {
		now := time.Duration(step) * ms
		f.now = now
		f.queued = max(f.queued-10, 0)
		for _, a := range arrivals {
			if step%a.every != 0 {
				continue
			}
			j := &job{a.c.Tenant, a.c.Tokens}
			f.offered[j.tenant]++
			p, _ := f.predict(j)
			switch v, why := g.Arrive(j, a.c, now, p, f.refuse); v {
			case Go:
				f.dispatch(j)
			case Reject:
				f.refuse(j, why)
			}
		}
		g.Release(now, f.predict, f.dispatch, f.refuse)
	}
	return f
}

// A higher band is served first whenever it would fit an emptier fleet,
// however much the band below floods the fleet, and whatever its requests
// need: a tighter SLO, or longer prompts. The band below gets the rest.
// (Found in review: the lower band kept the fleet just at its own
// threshold, and 231 of 240 interactive requests with a 1 s SLO were
// refused beside standard ones with 10 s; interactive prompts six times as
// long got 18k tokens of their 360k.)
func TestHigherBandFirstUnderLoad(t *testing.T) {
	for _, k := range []struct {
		name      string
		chat, etl arrival
		slo       time.Duration
	}{
		{"tighter SLO", arrival{Class{Tenant: "chat", Priority: Interactive, Tokens: 500}, 250}, arrival{Class{Tenant: "etl", Priority: Standard, Tokens: 500, SLO: 10 * time.Second}, 33}, time.Second},
		{"longer prompts", arrival{Class{Tenant: "chat", Priority: Interactive, Tokens: 3000}, 500}, arrival{Class{Tenant: "etl", Priority: Standard, Tokens: 500}, 50}, 2 * time.Second},
	} {
		f := runFIFO(t, Config{SLO: k.slo}, 0, k.chat, k.etl)
		t.Logf("%s: chat served %d tokens, refused %d of %d; etl served %d tokens, refused %d of %d", k.name,
			f.served["chat"], f.refused["chat"], f.offered["chat"], f.served["etl"], f.refused["etl"], f.offered["etl"])
		if f.refused["chat"] != 0 {
			t.Errorf("%s: %d of chat's %d requests refused, want none", k.name, f.refused["chat"], f.offered["chat"])
		}
		// The fleet serves 600k tokens a minute: etl gets what chat leaves.
		if rest := 600_000 - f.served["chat"]; f.served["etl"] < rest*9/10 {
			t.Errorf("%s: etl served %d tokens of the %d chat left", k.name, f.served["etl"], rest)
		}
	}
}

// Within a band, tenants share by their weights in tokens whatever their
// prompts: equal weights give comparable shares to long and short prompts,
// and a weight of 100 gets a tenant what it asks, or 100 times the other's
// share when both ask more than the fleet serves. (Found in review: 3k-token
// prompts got 18k tokens beside 500-token ones' 600k, weight 100 or not.)
func TestFairSharesWhateverThePrompts(t *testing.T) {
	long := func(every int) arrival { return arrival{Class{Tenant: "long", Tokens: 3000}, every} }
	short := arrival{Class{Tenant: "short", Tokens: 500}, 50}
	share := func(f *fifo) float64 {
		return float64(f.served["long"]) / float64(f.served["long"]+f.served["short"])
	}
	// Long asks 360k tokens a minute, short 600k, of the fleet's 600k.
	f := runFIFO(t, Config{SLO: 2 * time.Second}, 0, long(500), short)
	t.Logf("equal weights: long %d tokens, short %d", f.served["long"], f.served["short"])
	if s := share(f); s < 0.45 || s > 0.55 {
		t.Errorf("equal weights: long got %.3f of the tokens served, want about half", s)
	}
	f = runFIFO(t, Config{SLO: 2 * time.Second, Weights: map[string]float64{"long": 100}}, 0, long(500), short)
	t.Logf("long weighs 100: long %d tokens, short %d", f.served["long"], f.served["short"])
	if f.refused["long"] != 0 {
		t.Errorf("long weighs 100 and asks less than the fleet: %d of its %d requests refused", f.refused["long"], f.offered["long"])
	}
	// Both ask twice the fleet (after the first seconds, when the fleet
	// takes all; with rounds of 5 s for long rather than 41).
	flood := arrival{Class{Tenant: "short", Tokens: 500}, 25}
	f = runFIFO(t, Config{SLO: 2 * time.Second, Weights: map[string]float64{"long": 100}, MaxQueue: 10_000, Quantum: 500}, 5*time.Second, long(250), flood)
	ratio := float64(f.served["long"]) / float64(f.served["short"])
	t.Logf("both flood, long weighs 100: long %d tokens, short %d (%.0f×)", f.served["long"], f.served["short"], ratio)
	if ratio < 70 || ratio > 130 {
		t.Errorf("long weighing 100 got %.0f× short's tokens, want about 100×", ratio)
	}
	f = runFIFO(t, Config{SLO: 2 * time.Second, MaxQueue: 10_000}, 5*time.Second, long(250), flood)
	t.Logf("both flood, equal weights: long %d tokens, short %d", f.served["long"], f.served["short"])
	if s := share(f); s < 0.45 || s > 0.55 {
		t.Errorf("both flood, equal weights: long got %.3f of the tokens served, want about half", s)
	}
}

// A tenant asking for a lax SLO (a client may ask up to max_ttft_slo in a
// header) gets its share, not the fleet: it does not fill the engines'
// queues past what its band's other tenants need, whether they keep
// requests waiting or send them now and then.
func TestLaxSLOGetsItsShare(t *testing.T) {
	lax := arrival{Class{Tenant: "lax", Tokens: 500, SLO: 10 * time.Minute}, 40}
	f := runFIFO(t, Config{SLO: 2 * time.Second}, 0, arrival{Class{Tenant: "strict", Tokens: 500}, 50}, lax)
	t.Logf("both flood: strict %d tokens, lax %d", f.served["strict"], f.served["lax"])
	if s := float64(f.served["strict"]) / float64(f.served["strict"]+f.served["lax"]); s < 0.45 || s > 0.55 {
		t.Errorf("strict got %.3f of the tokens served, want about half", s)
	}
	f = runFIFO(t, Config{SLO: 2 * time.Second}, 0, arrival{Class{Tenant: "strict", Tokens: 500}, 500}, lax)
	t.Logf("strict now and then: strict %d tokens, refused %d of %d; lax %d tokens", f.served["strict"], f.refused["strict"], f.offered["strict"], f.served["lax"])
	if f.refused["strict"] != 0 {
		t.Errorf("strict, asking a tenth of the fleet: %d of its %d requests refused", f.refused["strict"], f.offered["strict"])
	}
}

// Release predicts a bounded number of times per request it sends, however
// many rounds of deficit round robin a tenant needs to send it. (Found in
// review: a tenant of weight 0.01 sending 128k tokens cost 3,126
// predictions, each taking the router's decision lock.)
func TestReleasePredictsBoundedly(t *testing.T) {
	g := gate(t, Config{SLO: time.Hour, Weights: map[string]float64{"tiny": MinWeight, "small": 0.03}})
	busy := Prediction{Best: 2 * time.Hour}
	for v, c := range []Class{{Tenant: "tiny", Tokens: 128_000}, {Tenant: "small", Tokens: 100_000}, {Tenant: "tiny", Tokens: 128_000}} {
		if verdict, _ := g.Arrive(v, c, 0, busy, nil); verdict != Hold {
			t.Fatalf("%d not held", v)
		}
	}
	predicts := 0
	var sent []int
	g.Release(time.Second, func(int) (Prediction, bool) {
		predicts++
		return Prediction{Best: time.Second}, true
	}, func(v int) { sent = append(sent, v) }, nil)
	// small needs 100k / (0.03 × 4096) = 814 rounds, tiny 128k / 41 = 3125:
	// small goes first, then tiny's two.
	if !slices.Equal(sent, []int{1, 0, 2}) {
		t.Errorf("sent %v, want small's then tiny's two", sent)
	}
	t.Logf("%d predictions for %d requests sent", predicts, len(sent))
	if predicts > 2*len(sent)+2 {
		t.Errorf("%d predictions for %d requests sent", predicts, len(sent))
	}
}

// backlog is a toy fleet of one queue for unit tests of Release: a
// request's forecast is the backlog plus its own cost, its floor its cost.
type backlog struct {
	ahead   time.Duration
	cost    map[int]time.Duration
	sent    []int
	refused []int
}

func (b *backlog) predict(v int) (Prediction, bool) {
	return Prediction{Best: b.ahead + b.cost[v], Floor: b.cost[v]}, true
}
func (b *backlog) dispatch(v int)         { b.sent = append(b.sent, v); b.ahead += b.cost[v] }
func (b *backlog) refuse(v int, _ Reason) { b.refused = append(b.refused, v) }
func (b *backlog) release(g *Gate[int], now time.Duration) {
	b.sent = b.sent[:0]
	g.Release(now, b.predict, b.dispatch, b.refuse)
}

// hold queues v of class c at now, held: its band or a tenant of it waits,
// or the fleet is too busy for it.
func (b *backlog) hold(t *testing.T, g *Gate[int], v int, c Class, now, cost time.Duration) {
	t.Helper()
	b.cost[v] = cost
	p, _ := b.predict(v)
	if verdict, why := g.Arrive(v, c, now, p, b.refuse); verdict != Hold {
		t.Fatalf("%d: %v (%s), want held", v, verdict, why)
	}
}

// A head that waits for the fleet's load to fall holds back the band below
// once a request sent past it is seen to push it further (one goes, to
// see), and goes first when the fleet frees; for Reprobe it holds them at
// once, then lets one go again to see. (The band below leaves the room a
// fresh request of the band above needs; a request of it that has waited
// needs more.)
func TestLoadedHeadHoldsWhatCompetes(t *testing.T) {
	g := gate(t, Config{SLO: 10 * time.Second})
	f := &backlog{ahead: 9 * time.Second, cost: map[int]time.Duration{}}
	chat := Class{Tenant: "chat", Priority: Interactive, SLO: 2 * time.Second}
	f.hold(t, g, 1, chat, 0, 500*ms) // it needs a forecast of 0.95 × 2 s, less 500 ms for itself
	for v := 10; v < 20; v++ {
		f.hold(t, g, v, Class{Tenant: "etl"}, 0, 100*ms)
	}
	f.release(g, 0)
	if len(f.sent) != 0 {
		t.Fatalf("sent %v past chat's room", f.sent)
	}
	f.ahead = time.Second
	f.release(g, time.Second) // chat needs 1.5 s ≤ 0.95 × 1 s: no; etl 1.1 s ≤ 1.4 s
	if !slices.Equal(f.sent, []int{10}) {
		t.Fatalf("sent %v, want one etl request, to see", f.sent)
	}
	f.release(g, 1100*ms)
	if len(f.sent) != 0 {
		t.Fatalf("sent %v past the held chat request", f.sent)
	}
	f.ahead = 200 * ms
	f.release(g, 1200*ms)
	if len(f.sent) == 0 || f.sent[0] != 1 {
		t.Fatalf("sent %v, want chat's first", f.sent)
	}
	// Chat's next, after Reprobe: one etl request goes again to see.
	f.ahead = 9 * time.Second
	f.hold(t, g, 2, chat, 3*time.Second, 500*ms)
	f.ahead = time.Second
	f.release(g, 4*time.Second)
	if len(f.sent) != 1 || f.sent[0] < 10 {
		t.Errorf("sent %v, want one etl request", f.sent)
	}
	f.release(g, 4*time.Second+ms)
	if len(f.sent) != 0 {
		t.Errorf("sent %v past the held chat request", f.sent)
	}
}

// A held head that can no longer meet its deadline even on an idle replica
// holds no one, and leaves with a refusal: holding is bounded by its SLO.
func TestHeldHeadExpires(t *testing.T) {
	g := gate(t, Config{SLO: 10 * time.Second})
	f := &backlog{ahead: 9 * time.Second, cost: map[int]time.Duration{}}
	f.hold(t, g, 1, Class{Tenant: "chat", Priority: Interactive, SLO: 2 * time.Second}, 0, 500*ms)
	f.hold(t, g, 2, Class{Tenant: "etl"}, 0, 100*ms)
	f.hold(t, g, 3, Class{Tenant: "etl"}, 0, 100*ms)
	f.ahead = time.Second // and no less: chat never fits
	f.release(g, time.Second)
	if !slices.Equal(f.sent, []int{2}) {
		t.Fatalf("sent %v, want one etl request, to see", f.sent)
	}
	for now := 1100 * ms; now <= 1400*ms; now += 100 * ms {
		if f.release(g, now); len(f.sent) != 0 {
			t.Fatalf("at %v: sent %v past the held chat request", now, f.sent)
		}
	}
	// Chat's 500 ms no longer fit 0.95 × its 500 ms left even on an idle
	// replica: it holds no one; then it is refused.
	f.release(g, 1500*ms)
	if !slices.Equal(f.sent, []int{3}) || len(f.refused) != 0 {
		t.Errorf("sent %v, refused %v: want etl's sent", f.sent, f.refused)
	}
	f.release(g, 1501*ms)
	if !slices.Equal(f.refused, []int{1}) || g.Len() != 0 {
		t.Errorf("refused %v, %d left: want chat's refused", f.refused, g.Len())
	}
}

// The room a band leaves for the bands above lasts ReserveFor after their
// last arrival; a request whose forecast is at most twice its floor is not
// held to it.
func TestRoomForTheBandsAbove(t *testing.T) {
	g := gate(t, Config{SLO: 10 * time.Second})
	chat := Class{Tenant: "chat", Priority: Interactive, SLO: time.Second}
	if v, _ := g.Arrive(1, chat, 0, Prediction{Best: 200 * ms, Floor: 100 * ms}, nil); v != Go {
		t.Fatalf("chat: %v", v)
	}
	// Chat's next needs the fleet's forecast at most 950 − 100 ms.
	etl := Class{Tenant: "etl", Tokens: 100}
	if v, _ := g.Arrive(2, etl, time.Second, Prediction{Best: 900 * ms, Floor: 100 * ms}, nil); v != Hold {
		t.Errorf("etl past chat's room: %v, want held", v)
	}
	if v, _ := g.Arrive(3, Class{Tenant: "big"}, time.Second, Prediction{Best: 3 * time.Second, Floor: 2 * time.Second}, nil); v != Hold {
		t.Errorf("a long prompt, with others waiting: %v, want held", v)
	}
	var sent []int
	g.Release(2*time.Second, func(v int) (Prediction, bool) {
		if v == 3 {
			return Prediction{Best: 3 * time.Second, Floor: 2 * time.Second}, true
		}
		return Prediction{Best: 850 * ms, Floor: 100 * ms}, true
	}, func(v int) { sent = append(sent, v) }, nil)
	if slices.Sort(sent); !slices.Equal(sent, []int{2, 3}) {
		t.Errorf("sent %v, want etl's within the room and the long prompt on a fleet about free for it", sent)
	}
	// A minute after the last of chat's, and of big's (whose requests
	// etl's leave room for too).
	if v, _ := g.Arrive(4, etl, time.Second+ReserveFor+ms, Prediction{Best: 9 * time.Second, Floor: 100 * ms}, nil); v != Go {
		t.Errorf("a minute after chat's last: %v, want go", v)
	}
}

// The room a tenant's next request needs goes by its recent arrivals'
// floors, averaged: one long prompt, whose floor nearly fills its SLO,
// does not hold the others to near-empty queues for a minute (found in
// review: the last arrival alone set the room).
func TestOneLongPromptReservesLittle(t *testing.T) {
	g := gate(t, Config{SLO: 10 * time.Second})
	chat := Class{Tenant: "chat", Priority: Interactive, SLO: time.Second}
	for i := range 5 {
		if v, _ := g.Arrive(i, chat, time.Duration(i)*ms, Prediction{Best: 200 * ms, Floor: 100 * ms}, nil); v != Go {
			t.Fatalf("chat %d: %v", i, v)
		}
	}
	if v, _ := g.Arrive(5, chat, 5*ms, Prediction{Best: 920 * ms, Floor: 900 * ms}, nil); v != Go {
		t.Fatalf("chat's long prompt: %v", v)
	}
	// The room is 950 − (100 + 800/5) = 690 ms, not 950 − 900 = 50 ms.
	if room := g.roomFor(Standard, "etl", 6*ms); room != 690*ms {
		t.Errorf("room left for chat's next: %v, want 690ms", room)
	}
}

// The bands of the priorities clients asked for are forgotten a minute
// after their last arrival, while nothing waits too (found in review:
// only Release forgot them, and it returns at once with an empty queue, so
// every priority ever asked kept a band for roomFor to walk).
func TestIdleQueueForgetsBands(t *testing.T) {
	g := gate(t, Config{SLO: 10 * time.Second})
	for p := range 50 {
		if v, _ := g.Arrive(p, Class{Tenant: "x", Priority: -p}, 0, Prediction{Best: ms, Floor: ms}, nil); v != Go {
			t.Fatalf("priority %d: %v", -p, v)
		}
	}
	if len(g.bands) != 50 {
		t.Fatalf("%d bands, want 50 remembered", len(g.bands))
	}
	g.Arrive(50, Class{Tenant: "x"}, ReserveFor+time.Second, Prediction{Best: ms, Floor: ms}, nil)
	if len(g.bands) > 1 {
		t.Errorf("%d bands a minute later, want the new arrival's alone", len(g.bands))
	}
}
