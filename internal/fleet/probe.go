package fleet

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/enginemetrics"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// timeoutFloor is half the least time a probe, a scrape or a model list
// is given.
const timeoutFloor = time.Second

// gone reports whether u no longer stands for a replica of the fleet (the
// router let it go, or a new replica took its id): its loops end, and the
// fleet retires it.
func (f *Fleet) gone(u *Upstream) bool {
	if f.Upstream(u.cfg.ID) != u {
		return true
	}
	if !f.rt.Has(u.cfg.ID) {
		f.retire(u.cfg.ID)
		return true
	}
	return false
}

// probeLoop probes a replica's round trip every ProbeInterval, the first
// at once if now; a reload's new interval applies to the wait under way.
func (f *Fleet) probeLoop(ctx context.Context, u *Upstream, now bool) {
	part := spread(u.ID()) // of the first interval: the replicas' probes spread over it
	for {
		if f.gone(u) {
			return
		}
		if now {
			f.probe(ctx, u)
		}
		now = true
		if !f.waitProbe(ctx, u, part) {
			return
		}
		part = 1
	}
}

// spread is the part of its first interval a replica's loops wait, one
// of spreadSlots in (0, 1], from its id: a fleet's replicas, started
// together, are probed and scraped in spreadSlots smaller bursts over
// each interval rather than all at once (2026-12-07, a user's test: 500
// replicas' 1,900 requests every 5 s, up to 830 in 100 ms, added 5–30 ms
// to the requests routed meanwhile). Slots rather than a spread as fine
// as the ids: each wake of the router's loops costs it CPU, and a burst
// of a tenth of the fleet still shares its wakes (at 500 replicas, idle:
// 7% of a core against 12% spread finely and 4% all at once). Scrapes
// wait half a slot less than probes, so as not to meet them.
func spread(id string) float64 {
	return math.Ceil(spreadSlots*(1-float64(xxhash.Sum64String(id)>>11)/(1<<53))) / spreadSlots
}

// spreadSlots is how many bursts a fleet's probes (and its scrapes) are
// spread in, each interval.
const spreadSlots = 10

// waitProbe waits a probe interval, reading the replica's models meanwhile
// when asked, at most once: a replica that keeps answering 404 for a
// model it lists neither delays its probes nor turns them into list
// reads. It reports false when ctx ends.
func (f *Fleet) waitProbe(ctx context.Context, u *Upstream, part float64) bool {
	refreshed := false
	return f.wait(ctx, func(c *Config) time.Duration { return time.Duration(part * float64(c.ProbeInterval)) }, u.refresh, func() {
		if !refreshed && u.served == nil { // a config's list comes back at the next probe
			refreshed = true
			f.refreshModels(ctx, u)
		}
	})
}

// wait waits the interval the config gives from now on, calling on for
// each value from ch meanwhile. A reload that changes the intervals makes
// it wait the new one's, from the same start (not at all if it has passed
// already). It reports false when ctx ends.
func (f *Fleet) wait(ctx context.Context, interval func(*Config) time.Duration, ch <-chan struct{}, on func()) bool {
	start := time.Now()
	changed := f.intervalChange() // before the config is read: a reload after is seen
	t := time.NewTimer(interval(f.cfg.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-changed:
			changed = f.intervalChange()
			t.Reset(time.Until(start.Add(interval(f.cfg.Load()))))
		case <-ch:
			on()
		}
	}
}

// intervalChange is closed by the next reload that changes the probe or
// scrape interval.
func (f *Fleet) intervalChange() <-chan struct{} { return *f.intervals.Load() }

// intervalsChanged wakes the loops waiting out the old intervals. Call
// after the new config is stored.
func (f *Fleet) intervalsChanged() {
	next := make(chan struct{})
	close(*f.intervals.Swap(&next))
}

// probe checks a replica's health and times its round trip: GET /health
// must answer 200, and a success feeds the round trip to the estimate and
// marks the replica up; a failure counts against it. Each of its requests,
// GET /health and GET /v1/models (its list), is timed from the request
// written to the first byte of its answer (timed), so that a new
// connection's handshake is not taken for the network. The round trip is
// the list's, whatever its answer, unless it came more than listSlack times
// later than /health's, or not at all: then /health's. SGLang's /health has
// its scheduler generate a token and answers a second or more later
// (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, on by default), where its list
// is answered at once: the list's is its network. A list slower than that
// (a large one, a stalled server) is not taken for it either. One request's
// time, not the least of the two: the least of two draws of a jittery
// link's round trip is below its mean (by 0.56 of its standard deviation:
// 45 ms of eu-frankfurt's 279 ± 80), which drew the router to far
// replicas, and the simulator's probe is one draw; the list taken unless
// listSlack times later leaves a bias of a few ms. The list is read after
// /health where the config does not list the replica's models; where it
// does, it is asked beside /health only to be timed, and waited for at most
// until listSlack times /health's time.
func (f *Fleet) probe(ctx context.Context, u *Upstream) {
	pctx, cancel := context.WithTimeout(ctx, max(f.Config().ProbeInterval, 2*timeoutFloor))
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, u.cfg.URL+"/health", nil)
	if err != nil {
		return
	}
	var listTimed <-chan time.Duration
	if u.served != nil {
		listTimed = f.timeList(ctx, u)
	}
	resp, rtt, err := f.timed(req)
	if listTimed != nil && err == nil {
		wait := time.NewTimer((listSlack-1)*rtt + 5*time.Millisecond)
		select {
		case d, ok := <-listTimed: // closed unanswered
			if ok && d <= listSlack*rtt {
				rtt = d
			}
		case <-wait.C:
		}
		wait.Stop()
	}
	if f.Upstream(u.cfg.ID) != u {
		if err == nil {
			resp.Body.Close()
		}
		return // replaced meanwhile: this probe says nothing of its successor
	}
	if err != nil {
		if pctx.Err() == nil || pctx.Err() == context.DeadlineExceeded {
			f.probeFailed(u.cfg.ID)
		}
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		f.probeFailed(u.cfg.ID)
		return
	}
	// What it serves, before its first probe makes it available.
	if listed, ok := f.refreshModels(ctx, u); ok && listed <= listSlack*rtt {
		rtt = listed
	}
	if f.rt.ObserveRTT(u.cfg.ID, rtt) != nil {
		return // left the fleet meanwhile
	}
	f.m.rtt.WithLabelValues(u.cfg.ID).Set(rtt.Seconds())
	f.probed(u)
	f.checkStall(u) // healthy as it says, but does it serve?
	// Put to sleep, or woken, elsewhere than through this router (before
	// it started, through another, by the trainer at the engine itself)?
	// vLLM says so, asked beside the probe (one question at a time); an
	// engine that answers it cannot say (SGLang) is asked no more, and
	// sleeps here as it was put to sleep here. The answer is taken only if
	// no client put it to sleep or woke it meanwhile: a question asked
	// before a client's /sleep, answered after it, would undo it.
	if !u.sleepless.Load() && u.asking.CompareAndSwap(false, true) {
		_, gen, err := f.rt.SleepMark(u.cfg.ID)
		if err != nil {
			u.asking.Store(false)
			return
		}
		go func() {
			defer u.asking.Store(false)
			asleep, known, answered := f.sleeping(ctx, u)
			switch {
			case answered && !known:
				u.sleepless.Store(true)
			case known && f.Upstream(u.cfg.ID) == u: // not a replaced replica's answer
				if changed, _ := f.rt.SetAsleepIf(u.cfg.ID, asleep, gen); changed {
					f.slept(u.cfg.ID, asleep)
				}
			}
		}()
	}
}

// listSlack bounds how much later than /health's a probe's list may answer
// and still be its round trip (see probe).
const listSlack = 3

// timeList asks a replica for its model list only to time the request
// (Fleet.timed), and sends the round trip when the replica answers,
// whatever its answer, then closes the channel; it closes it without a
// value when the replica does not answer within the list's wait, or ctx
// ends first. The request runs to its end (bounded as a list's read is).
func (f *Fleet) timeList(ctx context.Context, u *Upstream) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	ctx, cancel := context.WithTimeout(ctx, min(max(f.Config().ProbeInterval, 2*timeoutFloor), maxModelsWait))
	req, err := f.modelsRequest(ctx, u)
	if err != nil {
		cancel()
		close(out)
		return out
	}
	go func() {
		defer close(out)
		defer cancel()
		resp, rtt, err := f.timed(req)
		if err != nil {
			return
		}
		out <- rtt
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, models.MaxListBytes))
		resp.Body.Close()
	}()
	return out
}

// timed does req with the fleet's client and returns, with its response,
// the time from the request written to the first byte of the answer: a
// round trip and the replica's time to answer, without the dial and the
// TLS handshake of a new connection. Where the trace saw neither (it
// should not happen), the whole time is returned.
func (f *Fleet) timed(req *http.Request) (*http.Response, time.Duration, error) {
	start := time.Now()
	// The transport may call the hooks from its own goroutines, the write's
	// after the answer has come: atomics, not plain variables. A request
	// the transport writes again (its kept connection was closed under it)
	// is timed from its last write, on the connection that answered.
	var wrote, first atomic.Int64
	trace := &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Store(int64(time.Since(start))) },
		GotFirstResponseByte: func() { first.CompareAndSwap(0, int64(time.Since(start))) },
	}
	resp, err := f.client.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	total := time.Since(start)
	if err != nil {
		return nil, total, err
	}
	w, b := wrote.Load(), first.Load()
	if w == 0 || b == 0 || b < w {
		return resp, total, nil
	}
	return resp, time.Duration(b - w), nil
}

// scrapeLoop reads a replica's engine metrics every ScrapeInterval, the
// first at once; a reload's new interval applies to the wait under way.
func (f *Fleet) scrapeLoop(ctx context.Context, u *Upstream) {
	sc := &enginemetrics.Scraper{Client: f.client, URL: u.cfg.URL + u.cfg.MetricsPath}
	var last *enginemetrics.Metrics
	part := spread(u.ID()) - 0.5/spreadSlots // of the first interval (see spread)
	for {
		if f.gone(u) {
			return
		}
		last = f.scrape(ctx, u, sc, last)
		if !f.wait(ctx, func(c *Config) time.Duration { return time.Duration(part * float64(c.ScrapeInterval)) }, nil, nil) {
			return
		}
		part = 1
	}
}

// scrape reads a replica's engine metrics and returns them (last, when
// the scrape failed). A first failure after successes, and the recovery,
// are logged; an engine that restarted since the last scrape (its process
// start time changed, or its prompt-token counter went back) has an empty
// cache, and the router clears what it believed it held.
func (f *Fleet) scrape(ctx context.Context, u *Upstream, sc *enginemetrics.Scraper, last *enginemetrics.Metrics) *enginemetrics.Metrics {
	ctx, cancel := context.WithTimeout(ctx, max(f.Config().ScrapeInterval, 2*timeoutFloor))
	defer cancel()
	id := u.cfg.ID
	em, err := sc.Scrape(ctx)
	if err != nil {
		if ctx.Err() == nil || ctx.Err() == context.DeadlineExceeded {
			f.m.scrapeErrors.WithLabelValues(id).Inc()
			if !u.scrapeFailing.Swap(true) {
				f.log.Warn("scrape failed", "replica", id, "error", err)
			}
		}
		return last
	}
	if u.scrapeFailing.Swap(false) {
		f.log.Info("scrape works again", "replica", id)
	}
	restarted := last != nil && (em.StartTime != last.StartTime || em.PromptTokensTotal < last.PromptTokensTotal)
	if restarted {
		f.rt.ClearCache(id)
		f.m.restarts.WithLabelValues(id).Inc()
		f.log.Warn("replica restarted: the router clears what it believed its cache held", "replica", id)
	}
	u.scraped(&em, time.Now(), restarted)
	f.rt.ObserveEngine(id, policy.EngineGauges{Running: em.Running, Waiting: em.Waiting, KVUsedTokens: em.KVUsedTokens, CacheHitRate: em.CacheHitRate}, f.Now())
	f.noteForeign(u, em.Running+em.Waiting)
	f.rt.SetKVCapacity(id, em.KVCapacityTokens) // the engine knows its cache better than the config
	if em.LoRAKnown {
		f.rt.ObserveAdapters(id, router.AdapterGauges{MaxLoRAs: em.MaxLoRAs, Running: em.RunningAdapters, RunningCount: em.RunningAdapterCount})
	}
	return &em
}

// foreignScrapes is how many scrapes in a row must show a replica serving
// requests from elsewhere before the router says so, and how many must
// show none before it says it no longer does.
const foreignScrapes = 3

// noteForeign compares the requests a replica's engine serves (running
// and waiting, as scraped) with those this router, and its mesh peers,
// have in flight there. The engine counts a request only between its
// arrival and its last token, which the router's ledger spans, so more
// there than in the ledger is load from elsewhere: another router that
// does not share state, or clients that bypass the router. Decisions do
// not count it, so the replica's queue is longer than they think; the
// gauge shows it, and the log says so once it lasts. (A request whose
// client left may linger at the engine after the router let it go, hence
// the margin and the scrapes in a row.)
func (f *Fleet) noteForeign(u *Upstream, engine int) {
	id := u.cfg.ID
	st, err := f.rt.Replica(id)
	if err != nil {
		return
	}
	foreign := max(engine-st.InFlight, 0)
	f.m.foreign.WithLabelValues(id).Set(float64(foreign))
	run := u.foreignRun.Load()
	if foreign >= max(2, engine/10) {
		run = max(run, 0) + 1
	} else {
		run = min(run, 0) - 1
	}
	run = min(max(run, -foreignScrapes), foreignScrapes)
	u.foreignRun.Store(run)
	switch {
	case run == foreignScrapes && !u.foreignSaid.Swap(true):
		f.log.Warn("replica serves requests this router did not send (another router that does not share state, or clients that bypass it): its queue is longer than decisions count; routers in front of one fleet should share state (mesh:)",
			"replica", id, "engine", engine, "this router", st.InFlight)
	case run == -foreignScrapes && u.foreignSaid.Swap(false):
		f.log.Info("replica serves no more requests from elsewhere", "replica", id)
	}
}
