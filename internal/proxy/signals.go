package proxy

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/signal"
)

// probeLoop probes replica i's round trip every ProbeInterval.
func (s *Server) probeLoop(ctx context.Context, i int) error {
	t := time.NewTicker(s.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.probe(ctx, i)
		}
	}
}

// probe times GET /health on replica i: a success feeds the RTT estimate
// and marks the replica healthy; a failure counts against it.
func (s *Server) probe(ctx context.Context, i int) {
	u := s.reps[i]
	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.ProbeInterval, 2*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.cfg.URL+"/health", nil)
	if err != nil {
		return
	}
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() == nil || ctx.Err() == context.DeadlineExceeded {
			s.failed(i)
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rtt := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		s.failed(i)
		return
	}
	s.rt.ObserveRTT(i, rtt)
	s.m.rtt.WithLabelValues(u.cfg.ID).Set(rtt.Seconds())
	s.succeeded(i)
}

// scrapeLoop reads replica i's engine metrics every ScrapeInterval.
func (s *Server) scrapeLoop(ctx context.Context, i int) error {
	u := s.reps[i]
	sc := &signal.Scraper{Client: s.client, URL: u.cfg.URL + u.cfg.MetricsPath}
	t := time.NewTicker(s.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		s.scrape(ctx, i, sc)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Server) scrape(ctx context.Context, i int, sc *signal.Scraper) {
	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.ScrapeInterval, 2*time.Second))
	defer cancel()
	em, err := sc.Scrape(ctx)
	if err != nil {
		s.m.scrapeErrors.WithLabelValues(s.reps[i].cfg.ID).Inc()
		return
	}
	s.rt.ObserveEngine(i, route.EngineGauges{Running: em.Running, Waiting: em.Waiting, KVUsedTokens: em.KVUsedTokens, CacheHitRate: em.CacheHitRate}, s.now())
	s.rt.SetKVCapacity(i, em.KVCapacityTokens) // the engine knows its cache better than the config
}
