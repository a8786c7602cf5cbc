package router

import (
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Another router's dispatch reaches a replica before this router hears of
// it. A request router S sends at time s reaches replica X at s + d(S,X);
// this router R hears of it at s + d(S,R). A request R sends at t reaches
// X at t + d(R,X), behind S's requests sent before t + d(R,X) − d(S,X), of
// which R has heard those sent before t − d(S,R): those sent in the last
// d(S,R) + d(R,X) − d(S,X), the window, are ahead of it unheard of. R
// counts them in X's prefill backlog, in the view the policies see and in
// the forecast, as it learned them to be: once the news of S's dispatches
// comes, it knows how many uncached tokens each of its own decisions had
// unheard of ahead of it at X, and it takes their recent mean per decision.
// Where its decisions and S's dispatches come in the same bursts (clients
// driven by one clock) that is more than S's mean rate times the window,
// which is what it takes while it has made few decisions (a prior of
// priorDecisions, shrunk towards what it learns). That mean is over all
// its decisions; the replica a decision picks is the one that looked
// least loaded, where the others' bursts go too: so R also keeps, per
// origin over calibrationTau, what its decisions foretold of S's at the
// replicas they picked and what they then found there, and scales what
// it counts of S's by their ratio (calibration). (Measured in the
// simulator: docs/results.md, "Another router's unheard dispatches" and
// "Calibrated on the replicas picked".)

// Origin is the router whose request Enter mirrors, as this router knows
// it: what the prediction of its unheard dispatches needs.
type Origin struct {
	// Name tells the routers apart; "": no prediction (a yardstick whose
	// routers hear of each other's requests at once, a test).
	Name string
	// Leg is the one-way delay of the news from that router to this one.
	Leg time.Duration
	// RTT is that router's round trip to the replica when it dispatched
	// (its estimate; half is its leg to the replica).
	RTT time.Duration
}

// flowTau is the time constant over which an origin's rate of uncached
// tokens at a replica is averaged.
const flowTau = 10 * time.Second

// maxFlows bounds the origins a replica keeps a rate of: a mesh is a few
// regions of a few routers; past it the one with the least traffic makes
// room.
const maxFlows = 64

// flow is one origin's dispatches to a replica.
type flow struct {
	name   string
	since  time.Duration // when this router first heard of the origin's dispatches here
	tokens float64       // uncached tokens mirrored, decayed over flowTau, as of flows.at
	// realized is, of the same tokens, each dispatch's times the decisions
	// of this router it was unheard of at (those in its window before its
	// news came), decayed alike.
	realized float64
	// before is the router's count of decisions (decayed) when the flow
	// began, at since: those are not the flow's.
	before float64
	// settled is the first of the router's decisions (an index in
	// decisions) still in the window, as of the last read: it only moves
	// on while the window stays the same.
	settled int
	leg     time.Duration // Origin.Leg, the latest
	half    time.Duration // the origin's one-way to the replica (Origin.RTT/2), the latest
	// cal is the origin's calibration, the router's (nil: none, 1).
	cal *calibration
}

// flows are a replica's mirrored flows, one per origin, all decayed to
// the same time (so that a decision computes one decay for them all). n
// is how many, read without the lock: a router outside a mesh has none,
// and its decisions do not take the lock.
type flows struct {
	n  atomic.Int32
	mu sync.Mutex
	at time.Duration
	by []flow
}

// decay is the factor by which tokens counted at `at` have faded by now.
func decay(at, now time.Duration) float64 { return decayOver(at, now, flowTau) }

// decayOver is the factor by which what was counted at `at` has faded by
// now, over a time constant tau.
func decayOver(at, now, tau time.Duration) float64 {
	return math.Exp(-float64(max(now-at, 0)) / float64(tau))
}

// mirrored adds tokens dispatched by from, heard at now at a replica this
// router's one-way to is half; ds are the router's decisions.
func (fs *flows) mirrored(now time.Duration, from Origin, tokens int, half time.Duration, ds *decisions) {
	if from.Name == "" || from.Leg < 0 || from.RTT < 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if now > fs.at {
		k := decay(fs.at, now)
		for i := range fs.by {
			fs.by[i].tokens *= k
			fs.by[i].realized *= k
		}
		fs.at = now
	}
	leg, theirs := min(from.Leg, maxLeg), min(from.RTT/2, maxLeg)
	w := leg + half - theirs
	i := slices.IndexFunc(fs.by, func(f flow) bool { return f.name == from.Name })
	if i < 0 {
		if len(fs.by) < maxFlows {
			fs.by = append(fs.by, flow{})
			i = len(fs.by) - 1
		} else { // the least busy makes room
			i = 0
			for j := range fs.by {
				if fs.by[j].tokens < fs.by[i].tokens {
					i = j
				}
			}
		}
		// The flow's decisions are those its news can reach: from a window
		// before its first news on (the first news credits them too).
		fs.by[i] = flow{name: from.Name, since: now, before: ds.countBefore(now-max(w, 0), now), cal: ds.calibrationOf(from.Name, now)}
		fs.n.Store(int32(len(fs.by)))
	}
	f := &fs.by[i]
	f.tokens += float64(max(tokens, 0)) // heard at now, counted as of fs.at (≥ now)
	f.leg, f.half = leg, theirs
	if w > 0 && tokens > 0 {
		ds.mu.Lock()
		defer ds.mu.Unlock()
		// It was sent a leg ago: the decisions whose windows held it are
		// those of the last w, each counted as its decision is (decayed
		// from when it was made).
		f.realized += float64(tokens) * ds.since(ds.first(now-w), now)
		f.cal.fade(now) // what is due counts as it was
		f.cal.credit(fs, now-w, now, float64(tokens))
	}
}

// window is the flow's window for a router whose one-way to the replica
// is half: its leg, and this router's way there, less the origin's.
func (f *flow) window(half time.Duration) time.Duration { return f.leg + half - f.half }

// maxLeg bounds an origin's legs as told: the others' news may come from
// a hostile or broken peer.
const maxLeg = 10 * time.Second

// unheard is the uncached tokens the origins are taken to have sent the
// replica in their windows, as of now, for a router whose one-way to it
// is half; calibrated: each origin's scaled by the ratio of what the
// router's decisions found of its dispatches to what they foretold
// (calibration).
func (fs *flows) unheard(now, half time.Duration, ds *decisions, calibrated bool) int {
	if fs.n.Load() == 0 {
		return 0
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ds.mu.Lock() // after fs.mu, as in mirrored
	defer ds.mu.Unlock()
	total := 0.0
	for i := range fs.by {
		f := &fs.by[i]
		t := fs.learned(f, now, half, ds)
		if calibrated {
			t *= f.cal.ratio(now)
		}
		total += t
	}
	return int(min(total*decay(fs.at, now), maxUnheard))
}

// learned is a flow's unheard tokens as learned, counted as of fs.at: the
// mean of what its decisions found (those whose windows have passed, and
// those still in theirs for the part passed), shrunk towards the rate
// times the window. Call it with fs.mu and ds.mu.
func (fs *flows) learned(f *flow, now, half time.Duration, ds *decisions) float64 {
	window := f.window(half)
	if window <= 0 {
		return 0
	}
	// The rate times the window, and the mean of what the decisions whose
	// windows have passed found (both counted as of fs.at, the decisions
	// as of now: so is the result).
	prior := f.tokens * float64(window) / f.span(now)
	// The flow's decisions (not those before it: a replica added, an
	// origin met; a review saw the learned mean of a new flow at a ninth
	// of the truth) whose windows have passed, and each still in its
	// window by the part passed: it has had as much of its news.
	at := max(now, ds.last.at) // a read behind the latest decision: as of it (a review: two instants mixed)
	i := ds.firstInWindow(at-window, &f.settled)
	before, passed := ds.split(i, at, window)
	decided := max(before-f.before*decay(f.since, at)+passed, 0)
	return (f.realized + priorDecisions*prior) / (decided + priorDecisions)
}

// foretell adds, for a decision of this router that picked the replica at
// now, each origin's unheard tokens there as learned to what its
// calibration foretold.
func (fs *flows) foretell(now, half time.Duration, ds *decisions) {
	if fs.n.Load() == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ds.mu.Lock()
	defer ds.mu.Unlock()
	k := decay(fs.at, now)
	for i := range fs.by {
		f := &fs.by[i]
		if window := f.window(half); window > 0 {
			f.cal.foretell(pick{replica: fs, at: now, due: now + window, foretold: fs.learned(f, now, half, ds) * k})
		}
	}
}

// Unheard is the uncached tokens of the other routers' dispatches to
// replica id that this router counts in its backlog at now, not having
// heard of them yet (0 outside a mesh).
func (r *Router) Unheard(now time.Duration, id string) (int, error) {
	m, err := r.member(id)
	if err != nil {
		return 0, err
	}
	return m.unheard(now), nil
}

// A Calibration is what this router scales another router's unheard
// dispatches by: what its decisions found of them at the replicas they
// picked over what they foretold (1 until minPicks decisions count; held
// to [1/maxCalibration, maxCalibration]), and how many decisions count,
// decayed over calibrationTau.
type Calibration struct {
	Origin           string
	Ratio, Decisions float64
}

// Calibrations are this router's calibrations at now, by origin (none
// outside a mesh).
func (r *Router) Calibrations(now time.Duration) []Calibration {
	d := &r.decisions
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Calibration, 0, len(d.origins))
	for name, c := range d.origins {
		ratio := c.ratio(now) // brings its sums to now
		out = append(out, Calibration{Origin: name, Ratio: ratio, Decisions: c.picks})
	}
	slices.SortFunc(out, func(a, b Calibration) int { return strings.Compare(a.Origin, b.Origin) })
	return out
}

// unheard is the replica's flows' unheard tokens at now, for this router's
// one-way to it (half its probed round trip) and its decisions, as
// calibrated.
func (m *member) unheard(now time.Duration) int {
	return m.flows.unheard(now, time.Duration(m.rttNS.Load())/2, m.decisions, true)
}

// mirrored adds another router's dispatch of tokens uncached tokens to the
// replica's flows, heard at now.
func (m *member) mirrored(now time.Duration, from Origin, tokens int) {
	m.flows.mirrored(now, from, tokens, time.Duration(m.rttNS.Load())/2, m.decisions)
}

// pickedAt records that a decision of this router in a mesh picked the
// replica at now, foretelling each origin's unheard tokens there as
// learned: what calibrates them.
func (m *member) pickedAt(now time.Duration) {
	m.flows.foretell(now, time.Duration(m.rttNS.Load())/2, m.decisions)
}

// priorDecisions is how many decisions' worth the rate times the window
// weighs against what the router's decisions found.
const priorDecisions = 3

// decisions are a router's own decisions in a mesh (the latest
// maxDecisions, in order) and their count, decayed over flowTau; and the
// router's calibration of each origin.
type decisions struct {
	mu   sync.Mutex
	ring []decision
	n    int      // appended in all
	last decision // the latest (zero before the first)
	memo struct { // lastAt's
		at         time.Duration
		n          int
		count, age float64
	}
	// origins are the calibrations, by origin (at most maxOrigins).
	origins map[string]*calibration
}

// A decision is when one was made, with the decisions' count up to it and
// the sum of their ages then, each decayed over flowTau as of at: so that
// the count and the ages of those between two decisions are differences.
type decision struct {
	at    time.Duration
	count float64
	age   float64 // ns
}

// fadeTo is the decision's count and ages brought to now.
func (e decision) fadeTo(now time.Duration) (count, age float64) {
	k := decay(e.at, now)
	return e.count * k, (e.age + e.count*float64(max(now-e.at, 0))) * k
}

// maxDecisions bounds the decisions kept: a window (under a second) of a
// router deciding 16,000 times a second. Past it the decisions of a
// window are undercounted (a review: at 10,000 a second a window of 5 s,
// a leg only a broken peer tells, read 36% of its tokens).
const maxDecisions = 1 << 14

// A calibration is, for one origin, what the router's decisions found of
// its dispatches at the replicas they picked once the news came, against
// what they foretold there (its unheard tokens as learned), and how many
// decisions: all decayed over calibrationTau as of at, guarded by the
// router's decisions' mu. A decision is pending until its window has
// passed (the news of what was ahead of it may come until then): only
// then do its found and foretold count, together. One per origin, over
// all replicas: an origin's dispatches, a hostile peer's among them,
// calibrate its own flows alone.
type calibration struct {
	found, foretold, picks float64
	at                     time.Duration
	pending                []pick // from head on, in the order picked
	head                   int
	// A router deciding faster than maxPending a window keeps a sample of
	// its decisions: one in stride (by the hash of its sequence number,
	// seq), each counting for stride.
	stride uint64
	seq    uint64
	// evicted: past maxOrigins, its flows' decisions are no longer kept.
	evicted bool
}

// A pick is a decision of the router that picked a replica (its flows),
// pending until due, the end of its window; kept in a sample of one in
// weight (its sequence number's hash a multiple of weight), it counts for
// weight decisions.
type pick struct {
	replica         *flows
	at, due         time.Duration
	found, foretold float64
	seq, weight     uint64
}

// calibrationTau is the time constant over which a calibration sums: ten
// flows' worth, so that the ratio rests on a hundred seconds of decisions
// rather than one burst's.
const calibrationTau = 10 * flowTau

// The calibration is held to [1/maxCalibration, maxCalibration], and is 1
// until it rests on minPicks decisions (decayed) whose windows passed: a
// router just started, or idle while the others are busy, does not scale
// by its first few.
const (
	maxCalibration = 2
	minPicks       = 10
)

// maxOrigins bounds the calibrations a router keeps (a mesh has at most
// 256 routers); past it the one with the fewest decisions makes room.
// maxPending bounds an origin's pending decisions: past it half of them
// go, the others counting twice (a sample); past maxStride, the oldest.
const (
	maxOrigins = 256
	maxPending = 1 << 10
	maxStride  = 1 << 20
)

// fade brings the sums to now, counting the decisions due by then.
func (c *calibration) fade(now time.Duration) {
	if now > c.at {
		k := decayOver(c.at, now, calibrationTau)
		c.found *= k
		c.foretold *= k
		c.picks *= k
		c.at = now
	}
	for c.head < len(c.pending) && c.pending[c.head].due < now {
		c.settle(c.pending[c.head])
		c.head++
	}
	if c.head > 0 && 2*c.head >= len(c.pending) { // amortised: each pick moves at most once
		c.pending = c.pending[:copy(c.pending, c.pending[c.head:])]
		c.head = 0
	}
}

// settle counts a decision (decayed from when it was made to c.at).
func (c *calibration) settle(p pick) {
	k := decayOver(p.at, c.at, calibrationTau)
	w := float64(p.weight)
	c.found += p.found * k * w
	c.foretold += p.foretold * k * w
	c.picks += k * w
}

// foretell adds a decision, pending: into the sample.
func (c *calibration) foretell(p pick) {
	if c.evicted {
		return
	}
	c.fade(p.at)
	c.seq++
	switch n := len(c.pending) - c.head; {
	case n == 0:
		c.stride = 1 // none pending (or the first): no sample (a review: a stride left from before a lull let one decision stand for minPicks)
	case n >= maxPending:
		c.thin()
	case c.stride > 1 && n < maxPending/4:
		c.stride /= 2 // the rate fell: a denser sample
	}
	if sampled(c.seq, c.stride) {
		p.seq, p.weight = c.seq, c.stride
		c.pending = append(c.pending, p)
	}
}

// thin halves the pending sample: a pick stays, counting twice, if its
// hash is a multiple of twice its weight (so that it is a sample of a
// sample); the decisions to come are sampled as sparsely. Past
// maxStride, the oldest goes uncounted.
func (c *calibration) thin() {
	if c.stride >= maxStride {
		c.head++
		return
	}
	c.stride *= 2
	kept := c.pending[:0]
	for _, p := range c.pending[c.head:] {
		if sampled(p.seq, 2*p.weight) {
			p.weight *= 2
			kept = append(kept, p)
		}
	}
	clear(c.pending[len(kept):])
	c.pending, c.head = kept, 0
}

// sampled is whether the decision numbered seq is in a sample of one in
// stride (a power of two): its hash (SplitMix64's finaliser: the sample
// is the same in every run, and not in step with a cycle of replicas).
func sampled(seq, stride uint64) bool {
	z := seq + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return z&(stride-1) == 0
}

// credit adds tokens the origin dispatched to replica to what the
// decisions that picked it from from to to found.
func (c *calibration) credit(replica *flows, from, to time.Duration, tokens float64) {
	for i := c.head; i < len(c.pending); i++ {
		if p := &c.pending[i]; p.replica == replica && p.at >= from && p.at <= to {
			p.found += tokens
		}
	}
}

// ratio is what was found over what was foretold, at now: 1 without a
// calibration or before minPicks, else held to its bounds. Call it with
// the decisions' mu.
func (c *calibration) ratio(now time.Duration) float64 {
	c.fade(now)
	if c.foretold <= 0 || c.picks < minPicks {
		return 1
	}
	return min(max(c.found/c.foretold, 1.0/maxCalibration), maxCalibration)
}

// calibrationOf is the calibration of the named origin, made if new.
func (d *decisions) calibrationOf(name string, now time.Duration) *calibration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.origins[name]; ok {
		return c
	}
	if d.origins == nil {
		d.origins = make(map[string]*calibration)
	}
	if len(d.origins) >= maxOrigins {
		least, fewest := "", 0.0
		for n, c := range d.origins {
			if picks := c.picks * decayOver(c.at, now, calibrationTau); least == "" || picks < fewest {
				least, fewest = n, picks
			}
		}
		// Its flows keep it, at its ratio, but add no more decisions.
		d.origins[least].evicted, d.origins[least].pending, d.origins[least].head = true, nil, 0
		delete(d.origins, least)
	}
	c := &calibration{at: now}
	d.origins[name] = c
	return c
}

// add records a decision at now (no earlier than the last).
func (d *decisions) add(now time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ring == nil {
		d.ring = make([]decision, maxDecisions)
	}
	now = max(now, d.last.at)
	count, age := d.last.fadeTo(now)
	d.last = decision{at: now, count: count + 1, age: age}
	d.ring[d.n%maxDecisions] = d.last
	d.n++
}

// countBefore is the count of the decisions before from, faded to now.
func (d *decisions) countBefore(from, now time.Duration) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.before(d.first(from), now)
}

// before is the count of the decisions before the i-th, faded to now.
// Call it with d.mu.
func (d *decisions) before(i int, now time.Duration) float64 {
	if i <= 0 {
		return 0
	}
	if i-1 < d.n-maxDecisions { // no longer kept: all but those since, undecayed
		count, _ := d.lastAt(now)
		return max(count-float64(d.n-i), 0)
	}
	count, _ := d.ring[(i-1)%maxDecisions].fadeTo(now)
	return count
}

// split is the count of the decisions before the i-th, and over those
// from it on the part of a window each has passed by now, Σ (now − at) /
// window (half of each where the one before the i-th is no longer kept),
// all decayed as the decisions' count is, to now. Call it with d.mu.
func (d *decisions) split(i int, now, window time.Duration) (before, passed float64) {
	count, age := d.lastAt(now)
	switch {
	case i <= 0:
		return 0, min(max(age/float64(window), 0), count)
	case i-1 < d.n-maxDecisions:
		before = d.before(i, now)
		return before, (count - before) / 2
	}
	c, a := d.ring[(i-1)%maxDecisions].fadeTo(now)
	return c, min(max((age-a)/float64(window), 0), max(count-c, 0))
}

// lastAt is the decisions' count and ages faded to now, kept for the
// reads of one instant (a decision reads every replica's flows at it).
// Call it with d.mu.
func (d *decisions) lastAt(now time.Duration) (count, age float64) {
	if m := &d.memo; m.at != now || m.n != d.n {
		m.at, m.n = now, d.n
		m.count, m.age = d.last.fadeTo(now)
	}
	return d.memo.count, d.memo.age
}

// since is the count of the decisions from the i-th on, faded to now.
// Call it with d.mu.
func (d *decisions) since(i int, now time.Duration) float64 {
	count, _ := d.lastAt(now)
	return max(count-d.before(i, now), 0)
}

// first is the index of the first decision kept at or after from. Call it
// with d.mu.
func (d *decisions) first(from time.Duration) int {
	lo := max(d.n-maxDecisions, 0)
	return lo + sort.Search(d.n-lo, func(i int) bool { return d.ring[(lo+i)%maxDecisions].at >= from })
}

// firstInWindow is the index of the first decision kept at or after from,
// the first whose window has not passed. next is the caller's cache of
// it: moved on while the window stays the same, searched for when it
// shrank. Call it with d.mu.
func (d *decisions) firstInWindow(from time.Duration, next *int) int {
	lo := max(d.n-maxDecisions, 0)
	switch i := *next; {
	case i < lo || i > d.n || i > lo && d.ring[(i-1)%maxDecisions].at >= from:
		*next = d.first(from)
	default:
		for i < d.n && d.ring[i%maxDecisions].at < from {
			i++
		}
		*next = i
	}
	return *next
}

// span is the time the flow's tokens were heard in, as the decay weighs
// it: flowTau once it has been heard for long, less while it is young
// (a router that just started, or an origin it just met: the tokens of
// its first seconds are not to be spread over ten; at least a tenth of
// flowTau, so that one dispatch is not a rate by itself).
func (f *flow) span(now time.Duration) float64 {
	age := max(now-f.since, flowTau/10)
	if age >= 5*flowTau { // within 0.7%
		return float64(flowTau)
	}
	return float64(flowTau) * (1 - decay(0, age))
}

// maxUnheard bounds the prediction (tokens): a hostile origin's made-up
// prompts or leg must not overflow a backlog.
const maxUnheard = 1 << 30
