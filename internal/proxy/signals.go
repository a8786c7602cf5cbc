package proxy

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/signal"
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
	sc := &signal.Scraper{Client: s.client, URL: u.cfg.URL + u.cfg.MetricsPath}
	for {
		if s.gone(u) {
			return
		}
		s.scrape(ctx, u, sc)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.Config().ScrapeInterval):
		}
	}
}

func (s *Server) scrape(ctx context.Context, u *upstream, sc *signal.Scraper) {
	ctx, cancel := context.WithTimeout(ctx, max(s.Config().ScrapeInterval, 2*time.Second))
	defer cancel()
	em, err := sc.Scrape(ctx)
	if err != nil {
		if ctx.Err() == nil || ctx.Err() == context.DeadlineExceeded {
			s.m.scrapeErrors.WithLabelValues(u.cfg.ID).Inc()
		}
		return
	}
	id := u.cfg.ID
	s.rt.ObserveEngine(id, route.EngineGauges{Running: em.Running, Waiting: em.Waiting, KVUsedTokens: em.KVUsedTokens, CacheHitRate: em.CacheHitRate}, s.now())
	s.rt.SetKVCapacity(id, em.KVCapacityTokens) // the engine knows its cache better than the config
}
