package proxy

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/gorgo-llm/gorgo/internal/enginemetrics"
	"github.com/gorgo-llm/gorgo/internal/policy"
)

// gone reports whether u no longer stands for a replica of the fleet (the
// router forgot it, or a new replica took its id): its loops end, and the
// proxy forgets it.
func (s *Server) gone(u *upstream) bool {
	if s.upstream(u.cfg.ID) != u {
		return true
	}
	if !s.rt.Has(u.cfg.ID) {
		s.reap(u.cfg.ID)
		return true
	}
	return false
}

// probeLoop probes a replica's round trip every ProbeInterval, the first
// at once if now.
func (s *Server) probeLoop(ctx context.Context, u *upstream, now bool) {
	for {
		if s.gone(u) {
			return
		}
		if now {
			s.probe(ctx, u)
		}
		now = true
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.Config().ProbeInterval):
		}
	}
}

// probe times GET /health on a replica: a success feeds the RTT estimate
// and marks the replica up; a failure counts against it.
func (s *Server) probe(ctx context.Context, u *upstream) {
	ctx, cancel := context.WithTimeout(ctx, max(s.Config().ProbeInterval, 2*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.cfg.URL+"/health", nil)
	if err != nil {
		return
	}
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() == nil || ctx.Err() == context.DeadlineExceeded {
			s.probeFailed(u.cfg.ID)
		}
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	rtt := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		s.probeFailed(u.cfg.ID)
		return
	}
	if s.rt.ObserveRTT(u.cfg.ID, rtt) != nil {
		return // left the fleet meanwhile
	}
	s.m.rtt.WithLabelValues(u.cfg.ID).Set(rtt.Seconds())
	s.probed(u)
}

// scrapeLoop reads a replica's engine metrics every ScrapeInterval, the
// first at once.
func (s *Server) scrapeLoop(ctx context.Context, u *upstream) {
	sc := &enginemetrics.Scraper{Client: s.client, URL: u.cfg.URL + u.cfg.MetricsPath}
	var last *enginemetrics.Metrics
	for {
		if s.gone(u) {
			return
		}
		last = s.scrape(ctx, u, sc, last)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.Config().ScrapeInterval):
		}
	}
}

// scrape reads a replica's engine metrics and returns them (last, when
// the scrape failed). A first failure after successes, and the recovery,
// are logged; an engine that restarted since the last scrape (its process
// start time changed, or its prompt-token counter went back) has an empty
// cache, and the router forgets what it believed it held.
func (s *Server) scrape(ctx context.Context, u *upstream, sc *enginemetrics.Scraper, last *enginemetrics.Metrics) *enginemetrics.Metrics {
	ctx, cancel := context.WithTimeout(ctx, max(s.Config().ScrapeInterval, 2*time.Second))
	defer cancel()
	id := u.cfg.ID
	em, err := sc.Scrape(ctx)
	if err != nil {
		if ctx.Err() == nil || ctx.Err() == context.DeadlineExceeded {
			s.m.scrapeErrors.WithLabelValues(id).Inc()
			if !u.scrapeFailing.Swap(true) {
				s.log.Warn("scrape failed", "replica", id, "error", err)
			}
		}
		return last
	}
	if u.scrapeFailing.Swap(false) {
		s.log.Info("scrape works again", "replica", id)
	}
	if last != nil && (em.StartTime != last.StartTime || em.PromptTokensTotal < last.PromptTokensTotal) {
		s.rt.ForgetCache(id)
		s.m.restarts.WithLabelValues(id).Inc()
		s.log.Warn("replica restarted: the router forgets what it believed its cache held", "replica", id)
	}
	s.rt.ObserveEngine(id, policy.EngineGauges{Running: em.Running, Waiting: em.Waiting, KVUsedTokens: em.KVUsedTokens, CacheHitRate: em.CacheHitRate}, s.now())
	s.rt.SetKVCapacity(id, em.KVCapacityTokens) // the engine knows its cache better than the config
	return &em
}
