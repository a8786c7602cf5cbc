package emulator

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// clock maps wall time to model time. The model runs speed times faster
// than the wall clock; changing the speed keeps model time continuous.
// Frozen (a held engine: hold.go), model time stands still.
type clock struct {
	mu          sync.Mutex
	anchorWall  time.Time
	anchorModel time.Duration
	speed       float64
	frozen      bool
}

func newClock(now time.Time, speed float64) *clock {
	return &clock{anchorWall: now, speed: speed}
}

// model returns the model time at wall time t.
func (c *clock) model(t time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		return c.anchorModel
	}
	return c.anchorModel + scale(t.Sub(c.anchorWall), c.speed)
}

// wall returns the wall time at which the model reaches m (frozen, one
// far ahead: it does not).
func (c *clock) wall(m time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		return c.anchorWall.Add(time.Duration(maxScaled))
	}
	return c.anchorWall.Add(scale(m-c.anchorModel, 1/c.speed))
}

// freeze stops model time at wall time now; thaw lets it run on from
// there.
func (c *clock) freeze(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen {
		c.anchorModel += scale(now.Sub(c.anchorWall), c.speed)
		c.anchorWall, c.frozen = now, true
	}
}

func (c *clock) thaw(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		c.anchorWall, c.frozen = now, false
	}
}

// scale is d times f, held within ±maxScaled: a conversion past int64
// would wrap, and a wall time due centuries ahead would come at once.
func scale(d time.Duration, f float64) time.Duration {
	return time.Duration(math.Max(-maxScaled, math.Min(maxScaled, float64(d)*f)))
}

// maxScaled is about 146 years, half what a Duration holds: sums of two
// stay in range.
const maxScaled = float64(math.MaxInt64 / 2)

// setSpeed changes the speed from wall time now on.
func (c *clock) setSpeed(now time.Time, speed float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen {
		c.anchorModel += scale(now.Sub(c.anchorWall), c.speed)
	}
	c.anchorWall = now
	c.speed = speed
}

// stream receives one request's events. The driver never blocks on it.
type stream struct {
	mu     sync.Mutex
	evs    []engine.Event
	notify chan struct{}
	// at is the model time the request entered the engine.
	at time.Duration
}

func (s *stream) push(ev engine.Event) {
	s.mu.Lock()
	s.evs = append(s.evs, ev)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// take returns the events so far, waiting for at least one or ctx's end.
func (s *stream) take(ctx context.Context, buf []engine.Event) ([]engine.Event, error) {
	for {
		s.mu.Lock()
		if len(s.evs) > 0 {
			buf = append(buf[:0], s.evs...)
			s.evs = s.evs[:0]
			s.mu.Unlock()
			return buf, nil
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return buf[:0], ctx.Err()
		}
	}
}

// driver runs an engine model against the wall clock: steps end, and
// tokens come out, when the model says they do.
type driver struct {
	mu      sync.Mutex
	eng     *engine.Engine
	clk     *clock
	streams map[uint64]*stream
	nextID  uint64
	kick    chan struct{}
	evs     []engine.Event
	// held are the sequences that wait for the first token of their
	// prompt's first sequence, by its ID (see submit); ready those whose
	// wait is over, entered into the engine as its queue takes them.
	held  map[uint64][]engine.Request
	ready []engine.Request
	// observe is called, under the driver's lock, for each event with the
	// request's entry time (for latency histograms).
	observe func(ev engine.Event, entered time.Duration)
	// forget is called, under the driver's lock, for a cancelled request.
	forget func(id uint64)
	// samples keeps recent (model time, generated tokens, busy) points for
	// throughput gauges.
	samples []sample
	// spin makes the driver spin the last stretch before a step ends.
	spin bool
}

type sample struct {
	at        time.Duration
	generated int64
}

func newDriver(eng *engine.Engine, clk *clock) *driver {
	return &driver{eng: eng, clk: clk, streams: make(map[uint64]*stream), held: make(map[uint64][]engine.Request), kick: make(chan struct{}, 1)}
}

// submit enters a request's sequences (its n answers, as vLLM fans one
// out, for each of its prompts; their IDs, first to first+len(rs)-1, are
// assigned here) and returns the stream of all their events. Sequence i
// enters once sequence after[i] (an earlier one) has its first token, or
// at once where after[i] is negative (after nil: all at once): an
// n-answer prompt's siblings wait for its first sequence, so that they
// find the prompt in the cache and the engine computes it once (SGLang
// prefills such a prompt alone first; vLLM's siblings share its blocks),
// and a batch's prompt that shares its opening with an earlier one waits
// for it, as SGLang holds it back (vLLM caches each block as it fills).
// Every sequence's length is the same, so nothing waits on a later
// sibling. A request refused for a full queue is refused whole; once its
// first sequence is in, its later ones wait for room, as a batch in an
// engine's own queue would.
func (d *driver) submit(rs []engine.Request, after []int) (s *stream, first uint64, err error) {
	d.mu.Lock()
	now := d.clk.model(time.Now())
	d.advanceLocked(now)
	s = &stream{notify: make(chan struct{}, 1), at: now}
	first = d.nextID + 1
	full := false // a later sequence found the queue full: it and the rest wait their turn
	for i, r := range rs {
		d.nextID++
		r.ID = d.nextID
		if i < len(after) && after[i] >= 0 && !d.cachedLocked(r, rs[after[i]]) {
			// Refused now if the engine would refuse it, not when its
			// turn comes: the request is refused whole.
			if err := d.eng.Check(r); err != nil {
				d.cancelLocked(first, i)
				d.mu.Unlock()
				return nil, 0, err
			}
			leader := first + uint64(after[i])
			d.held[leader] = append(d.held[leader], r)
		} else if full {
			d.ready = append(d.ready, r)
		} else if err := d.eng.Submit(now, r); errors.Is(err, engine.ErrQueueFull) && i > 0 {
			full = true
			d.ready = append(d.ready, r)
		} else if err != nil {
			d.cancelLocked(first, i)
			d.mu.Unlock()
			return nil, 0, err
		}
		d.streams[r.ID] = s
	}
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
	return s, first, nil
}

// cachedLocked reports whether the engine already holds the full blocks r
// shares with the sequence it would wait for (a prompt seen before): it
// need not wait. Call with d.mu.
func (d *driver) cachedLocked(r, leader engine.Request) bool {
	shared := min(prefix.CommonPrefix(r.Blocks, leader.Blocks), len(r.Blocks)-1)
	return d.eng.CachedBlocks(r.Blocks) >= shared
}

// cancel removes the n sequences from first of a request whose client
// went away.
func (d *driver) cancel(first uint64, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cancelLocked(first, n)
}

func (d *driver) cancelLocked(first uint64, n int) {
	last := first + uint64(n)
	d.ready = slices.DeleteFunc(d.ready, func(r engine.Request) bool { return r.ID >= first && r.ID < last })
	for id := first; id < last; id++ {
		delete(d.held, id)
		if _, ok := d.streams[id]; ok {
			d.eng.Cancel(id)
			delete(d.streams, id)
			if d.forget != nil {
				d.forget(id)
			}
		}
	}
}

// flush empties the engine's prefix cache if it has no request, held
// ones included (engine.Engine.Flush).
func (d *driver) flush() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.advanceLocked(d.clk.model(time.Now()))
	if len(d.ready) > 0 || len(d.held) > 0 {
		return false
	}
	return d.eng.Flush()
}

// idle reports whether the engine has no request, held ones included.
func (d *driver) idle() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.advanceLocked(d.clk.model(time.Now()))
	return len(d.streams) == 0 && len(d.ready) == 0 && len(d.held) == 0
}

// awaitIdle waits until the engine has no request, or ctx ends.
func (d *driver) awaitIdle(ctx context.Context) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !d.idle() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// wake has the driver look at the model again (its speed, or whether its
// clock runs, changed).
func (d *driver) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// gauges returns the engine's gauges now and its recent generation
// throughput (tokens per model second).
func (d *driver) gauges() (engine.Gauges, float64) {
	g, tput, _, _ := d.snapshot(false)
	return g, tput
}

// snapshot is gauges, and with adapters the distinct adapters of the
// running and the waiting requests, all at one instant.
func (d *driver) snapshot(adapters bool) (g engine.Gauges, tput float64, running, waiting []uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.advanceLocked(d.clk.model(time.Now()))
	g = d.eng.Gauges()
	// Sequences held for their prompt wait too, as the engines count a
	// request's n at once.
	g.Waiting += len(d.ready)
	for _, rs := range d.held {
		g.Waiting += len(rs)
	}
	if adapters {
		running, waiting = d.eng.Adapters(nil, nil)
	}
	if n := len(d.samples); n > 1 {
		a, b := d.samples[0], d.samples[n-1]
		if dt := (b.at - a.at).Seconds(); dt > 0 {
			tput = float64(b.generated-a.generated) / dt
		}
	}
	return g, tput, running, waiting
}

// advanceLocked runs the model to now and hands out what it emitted.
func (d *driver) advanceLocked(now time.Duration) {
	d.evs = d.eng.Advance(now, d.evs[:0])
	for _, ev := range d.evs {
		s := d.streams[ev.ID]
		if s == nil {
			continue
		}
		if d.observe != nil {
			d.observe(ev, s.at)
		}
		s.push(ev)
		if ev.Kind == engine.EventFinish {
			delete(d.streams, ev.ID)
		}
		if ev.Kind == engine.EventFirstToken {
			if rs, ok := d.held[ev.ID]; ok {
				d.ready = append(d.ready, rs...)
				delete(d.held, ev.ID)
			}
		}
	}
	// The siblings whose prompt is now cached; a full queue takes them
	// later, in order.
	k := 0
	for ; k < len(d.ready); k++ {
		if err := d.eng.Submit(now, d.ready[k]); errors.Is(err, engine.ErrQueueFull) {
			break
		} else if err != nil {
			// Its first sibling was taken with the same request: not
			// reached. Ended, so that its client is not left waiting.
			if st := d.streams[d.ready[k].ID]; st != nil {
				st.push(engine.Event{Kind: engine.EventFinish, ID: d.ready[k].ID, Time: now})
				delete(d.streams, d.ready[k].ID)
			}
		}
	}
	d.ready = append(d.ready[:0], d.ready[k:]...)
	// Keep about 10 s of model time of throughput samples, one per 100 ms.
	gen := d.eng.Gauges().GeneratedTokens
	if n := len(d.samples); n == 0 || now-d.samples[n-1].at >= 100*time.Millisecond {
		d.samples = append(d.samples, sample{at: now, generated: gen})
		for len(d.samples) > 1 && now-d.samples[0].at > 10*time.Second {
			d.samples = d.samples[1:]
		}
	}
}

// spinWindow is how long before a step's end the driver stops sleeping on
// a timer and spins (yielding) instead: an idle Go process sleeps in
// epoll with millisecond resolution, so its timers fire up to a
// millisecond late, which a client timing tokens 10 ms apart would see.
// The spin is at most a quarter of the wait, so it costs at most a quarter
// of a core however fast the model runs.
const spinWindow = 1500 * time.Microsecond

// run drives the model until ctx ends.
func (d *driver) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		d.advanceLocked(d.clk.model(time.Now()))
		next, ok := d.eng.Next()
		d.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if !ok {
			select {
			case <-ctx.Done():
				return nil
			case <-d.kick:
			}
			continue
		}
		due := d.clk.wall(next)
		until := time.Until(due)
		spin := time.Duration(0)
		if d.spin {
			spin = min(spinWindow, until/4)
		}
		if wait := until - spin; wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return nil
			case <-d.kick:
				timer.Stop() // Go 1.23+ timers: no stale value to drain
				continue
			case <-timer.C:
			}
		}
		for time.Now().Before(due) {
			select {
			case <-d.kick:
				due = time.Time{} // something changed: recompute at once
			default:
				runtime.Gosched()
			}
		}
	}
}
