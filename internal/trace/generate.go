package trace

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// DefaultDuration is the window Generate produces when GenConfig.Duration
// is 0.
const DefaultDuration = 30 * time.Minute

// MaxGenerated bounds the requests Generate simulates, its warm-up's
// included: about 20 s of work and a few GB at most.
const MaxGenerated = 20e6

// GenConfig configures Generate. The zero value is a 30-minute artchat
// window with seed 0.
type GenConfig struct {
	// Preset names the workload shape (see Presets); "" is DefaultPreset.
	Preset string
	// Seed seeds the random source: equal configs give equal workloads.
	Seed uint64
	// Duration is the length of the generated window; 0 is
	// DefaultDuration. Requests arrive in [0, Duration).
	Duration time.Duration
	// Rate is the mean arrival rate in requests/s; 0 is the preset's
	// default. It scales the arrival of users (and so the number of users
	// and sessions) and leaves each user's behaviour unchanged, so the
	// achieved rate matches it up to sampling noise.
	Rate float64
}

// Generate returns a synthetic workload: requests in time order, each with
// Session, Turn, User and HashIDs consistent with its conversation's content.
//
// The process starts before time 0 (the preset's warm-up, up to hours) and
// only requests in [0, Duration) are kept, so the window is in steady state:
// conversations in progress at time 0 arrive with long contexts and turns
// above 1. Block ids are numbered in order of first use in the window.
func Generate(cfg GenConfig) ([]Request, error) {
	name := cfg.Preset
	if name == "" {
		name = DefaultPreset
	}
	p, ok := presets[name]
	if !ok {
		return nil, fmt.Errorf("unknown workload preset %q (valid: %s)", cfg.Preset, strings.Join(Presets(), ", "))
	}
	if cfg.Duration < 0 {
		return nil, fmt.Errorf("generating %s: duration must be non-negative, got %v", name, cfg.Duration)
	}
	if cfg.Rate < 0 || math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) {
		return nil, fmt.Errorf("generating %s: rate must be a finite number >= 0 (0 = preset default), got %v", name, cfg.Rate)
	}
	d := cfg.Duration
	if d == 0 {
		d = DefaultDuration
	}
	// The process runs through the preset's warm-up before the window, at
	// the window's rate: its cost is the rate times both (a researcher's
	// test, 2026-12-06: --rate 100000 --duration 1s ran out of memory in
	// the warm-up, without a word).
	rate := cfg.Rate
	if rate == 0 {
		rate = p.rate
	}
	if n := rate * (p.warmup + d.Seconds()); n > MaxGenerated {
		return nil, fmt.Errorf("generating %s: %.0f requests a second over the window and the preset's %v warm-up before it are %.3g requests to simulate; at most %.3g (a shorter --duration, or a lower rate)",
			name, rate, time.Duration(p.warmup*float64(time.Second)), n, float64(MaxGenerated))
	}
	g := newGenerator(p, cfg.Seed, d.Seconds(), cfg.Rate)
	g.run()
	return g.out, nil
}

// generator runs one preset's process.
type generator struct {
	p        *preset
	rng      *rand.Rand
	end      float64 // window end, s
	userRate float64 // users/s
	tenants  []tenantState
	weights  float64 // sum of tenant weights

	users  userHeap
	seq    int    // users created so far
	nextID uint64 // next block id
	ids    idArena
	nUsers int // users seen in the window
	nConvs int // conversations seen in the window
	out    []Request
}

// tenantState is a tenant and the ids of its system prompt's full blocks.
type tenantState struct {
	tenantSpec
	ids []uint64
}

// genUser is one simulated user.
type genUser struct {
	seq     int
	tenant  *tenantState
	pace    float64
	leave   float64 // time the user stops starting conversations, s
	id      string  // user id, given at the first request in the window
	next    float64 // time of the next request, s
	nextMsg int     // tokens the next request appends
	conv    genConv
}

// genConv is a user's current conversation.
type genConv struct {
	session string   // given at the first request in the window
	turn    int      // turns sent so far
	turns   int      // planned turns
	verbose float64  // factor on its outputs (1 without the preset's verbosity)
	ctx     int      // tokens so far: system prompt, messages and outputs
	ids     []uint64 // ids of its own full blocks, after the tenant's
}

func newGenerator(p *preset, seed uint64, end, rate float64) *generator {
	g := &generator{
		p:        p,
		rng:      rand.New(rand.NewPCG(splitmix64(seed), splitmix64(seed^0x6a09e667f3bcc909))),
		end:      end,
		userRate: p.userRate,
	}
	if rate > 0 {
		g.userRate *= rate / p.rate
	}
	for _, t := range p.tenants {
		g.tenants = append(g.tenants, tenantState{tenantSpec: t})
		g.weights += t.weight
	}
	expected := p.rate * end
	if rate > 0 {
		expected = rate * end
	}
	g.out = make([]Request, 0, int(min(expected*1.1, 1<<20))+16)
	return g
}

// run simulates from -warmup to the end of the window.
func (g *generator) run() {
	if g.userRate <= 0 {
		return
	}
	start := -g.p.warmup
	// Users already present at the start: with exponential lifetimes the
	// number present is Poisson(userRate*userLife) and their remaining
	// lifetimes are again exponential.
	if g.p.userLife > 0 {
		mean := g.userRate * g.p.userLife
		for sum := g.rng.ExpFloat64(); sum < mean; sum += g.rng.ExpFloat64() {
			u := g.newUser(start)
			u.next = start + g.rng.Float64()*g.p.convGap.median
			heap.Push(&g.users, u)
		}
	}
	arrival := start + g.rng.ExpFloat64()/g.userRate
	for {
		if arrival < g.end && (len(g.users) == 0 || arrival < g.users[0].next) {
			u := g.newUser(arrival)
			u.next = arrival
			heap.Push(&g.users, u)
			arrival += g.rng.ExpFloat64() / g.userRate
			continue
		}
		if len(g.users) == 0 || g.users[0].next >= g.end {
			return
		}
		u := g.users[0]
		if g.fire(u) {
			heap.Fix(&g.users, 0)
		} else {
			heap.Pop(&g.users)
		}
	}
}

// newUser creates a user arriving at t, with its first conversation.
func (g *generator) newUser(t float64) *genUser {
	u := &genUser{seq: g.seq, leave: math.Inf(1), pace: 1}
	g.seq++
	x := g.rng.Float64() * g.weights
	u.tenant = &g.tenants[len(g.tenants)-1]
	for i := range g.tenants {
		if x < g.tenants[i].weight {
			u.tenant = &g.tenants[i]
			break
		}
		x -= g.tenants[i].weight
	}
	if s := g.p.pace; s > 0 {
		u.pace = math.Exp(s*g.rng.NormFloat64() - s*s/2)
	}
	if g.p.userLife > 0 {
		u.leave = t + g.rng.ExpFloat64()*g.p.userLife
	}
	g.startConv(u)
	return u
}

// startConv gives u a new conversation.
func (g *generator) startConv(u *genUser) {
	turns, msg := 1, g.p.singleMsg
	if g.rng.Float64() >= g.p.singleTurn {
		turns, msg = max(2, g.p.turns.intn(g.rng)), g.p.firstMsg
	}
	u.conv = genConv{turns: turns, verbose: 1, ctx: u.tenant.systemTokens}
	if s := g.p.verbosity; s > 0 {
		u.conv.verbose = math.Exp(s * g.rng.NormFloat64())
	}
	room := g.p.maxContext - u.conv.ctx
	u.nextMsg = min(max(1, msg.intn(g.rng)), room)
}

// fire sends u's next request and schedules the one after; it reports
// whether u has another request.
func (g *generator) fire(u *genUser) bool {
	p, c, t := g.p, &u.conv, u.next
	c.turn++
	prompt := c.ctx + u.nextMsg
	output := &p.output
	if u.tenant.output != nil {
		output = u.tenant.output
	}
	out := max(1, int(math.Round(c.verbose*output.sample(g.rng))))
	if c.verbose != 1 {
		out = min(max(out, int(output.lo)), int(output.hi)) // still within the application's range
	}
	if t >= 0 && t < g.end {
		g.emit(u, t, prompt, out)
	}
	c.ctx = prompt + out
	done := t + float64(out)*p.tokenTime
	if c.turn < c.turns {
		msg := max(1, p.nextMsg.intn(g.rng))
		if c.ctx+msg <= p.maxContext {
			u.nextMsg = msg
			u.next = done + u.pace*p.think.sample(g.rng)
			return true
		}
	}
	if p.userLife == 0 {
		return false
	}
	next := done + u.pace*p.convGap.sample(g.rng)
	if next >= u.leave {
		return false
	}
	g.startConv(u)
	u.next = next
	return true
}

// emit appends u's request at t to the window.
func (g *generator) emit(u *genUser, t float64, prompt, out int) {
	c := &u.conv
	if u.id == "" {
		g.nUsers++
		u.id = "u" + strconv.Itoa(g.nUsers)
	}
	if c.session == "" {
		g.nConvs++
		c.session = "s" + strconv.Itoa(g.nConvs)
	}
	n := BlockCount(prompt)
	full := prompt / BlockTokens
	ids := g.ids.alloc(n)
	tenantFull := u.tenant.systemTokens / BlockTokens
	for j := 0; j < full; j++ {
		if j < tenantFull {
			for len(u.tenant.ids) <= j {
				u.tenant.ids = append(u.tenant.ids, g.newID())
			}
			ids[j] = u.tenant.ids[j]
			continue
		}
		k := j - tenantFull
		for len(c.ids) <= k {
			c.ids = append(c.ids, g.newID())
		}
		ids[j] = c.ids[k]
	}
	if full < n {
		ids[full] = g.newID()
	}
	at := time.Duration(math.Round(t * float64(time.Second)))
	if end := time.Duration(math.Round(g.end * float64(time.Second))); at >= end {
		at = end - 1 // t < end, but rounding reached it
	}
	g.out = append(g.out, Request{
		Time:         at,
		Session:      c.session,
		Turn:         c.turn,
		User:         u.id,
		InputTokens:  prompt,
		OutputTokens: out,
		HashIDs:      ids,
	})
}

// Unstreamed reports whether the i-th request of a workload (sorted by
// time) asks for its answer whole, not streamed, where a share of them
// do: a draw by its index and the seed, the same in the simulator
// (sim.Config.Unstreamed) and the replayer (replay.Config.Unstreamed), so
// that a live run and its simulation leave the same requests whole.
func Unstreamed(i int, seed uint64, share float64) bool {
	if share <= 0 {
		return false
	}
	// splitmix64's finaliser of i ^ seed·φ (less the φ it adds: the draws
	// the simulator has always made).
	z := splitmix64(uint64(i) ^ seed*0x9e3779b97f4a7c15 - 0x9e3779b97f4a7c15)
	return float64(z>>11)/(1<<53) < share
}

// splitmix64 scrambles a seed, so that nearby seeds give unrelated streams.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func (g *generator) newID() uint64 {
	id := g.nextID
	g.nextID++
	return id
}

// userHeap orders users by their next request time, then by creation.
type userHeap []*genUser

func (h userHeap) Len() int { return len(h) }
func (h userHeap) Less(i, j int) bool {
	if h[i].next != h[j].next {
		return h[i].next < h[j].next
	}
	return h[i].seq < h[j].seq
}
func (h userHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *userHeap) Push(x any)   { *h = append(*h, x.(*genUser)) }
func (h *userHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return u
}
