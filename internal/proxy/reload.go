package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// Reload reads the config file again and applies it (see Apply). A file
// that fails to read, parse or validate changes nothing: the running
// config stays, and the error is logged and returned.
func (s *Server) Reload() error {
	if s.path == "" {
		return errors.New("no config file to reload (the proxy was started without --config)")
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	s.fileMod = modTime(s.path)
	cfg, err := LoadConfig(s.path)
	if err == nil {
		cfg, err = s.withFlags(cfg)
	}
	if err != nil {
		s.m.reloads.WithLabelValues("failed").Inc()
		s.log.Error("config not reloaded: the running config stays", "file", s.path, "error", err)
		return err
	}
	return s.apply(cfg)
}

// flags are settings given on the command line, which win over the file's
// on every reload too.
type flags struct {
	replicas []ReplicaConfig
	apply    func(*Config) error
}

// SetFlags records what the command line set, to apply over the file on
// each reload: replicas it adds and a function that overrides settings.
func (s *Server) SetFlags(replicas []ReplicaConfig, apply func(*Config) error) {
	s.flags = flags{replicas: replicas, apply: apply}
}

func (s *Server) withFlags(cfg Config) (Config, error) {
	cfg.Replicas = append(cfg.Replicas, s.flags.replicas...)
	if s.flags.apply != nil {
		if err := s.flags.apply(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// Apply makes next the running config, as far as it can change live:
// replicas present in both keep their state (those whose URL changed start
// afresh), new ones are added, those no longer listed are drained then
// removed; DNS groups are re-read; the header and idle timeouts, the
// failure threshold, the intervals, admin tokens and (for gorgo and
// gorgo-ms) weights take effect at once. Settings that cannot change live
// (see fixed) keep their running values and are logged as needing a
// restart; the config is validated with them. A config that fails to
// validate changes nothing.
func (s *Server) Apply(next Config) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return s.apply(next)
}

func (s *Server) apply(next Config) error {
	next = next.Defaults()
	cur := s.Config()
	// What cannot change live keeps its running value first, so that the
	// checks below judge the config that will run (an admin listener that
	// stays on a public address keeps needing a token).
	restart := fixed(&cur, &next)
	err := next.Validate()
	var toks, keys []token
	if err == nil {
		toks, err = next.Admin.tokens()
	}
	if err == nil {
		keys, err = next.Auth.keys()
	}
	var cert *tls.Certificate
	if err == nil {
		cert, err = next.TLS.load()
	}
	if err == nil && (cert == nil) != (s.cert.Load() == nil) {
		err = errors.New("config: turning TLS on or off needs a restart (a reload only renews the certificate)")
	}
	if err != nil {
		s.m.reloads.WithLabelValues("failed").Inc()
		s.log.Error("config not applied: the running config stays", "error", err)
		return err
	}
	weightsChanged := false
	if !reflect.DeepEqual(cur.Params, next.Params) {
		if err := s.applyParams(next); err != nil {
			restart = append(restart, "params: "+err.Error())
			next.Params = cur.Params
		} else {
			weightsChanged = true
		}
	}
	added, removed, changed := s.applyReplicas(next.Replicas)
	s.cfg.Store(&next)
	s.tokens.Store(&toks)
	s.keys.Store(&keys)
	if cert != nil {
		s.cert.Store(cert)
	}
	if next.RateLimit != cur.RateLimit {
		s.limits.Store(newLimiters(next.RateLimit))
	}
	groups := !reflect.DeepEqual(cur.Discover, next.Discover)
	if groups {
		if err := s.startDiscovery(next.Discover); err != nil {
			s.log.Error("discover groups not applied", "error", err)
		}
	}
	result := "applied"
	if len(added)+len(removed)+len(changed) == 0 && !groups && !weightsChanged && reflect.DeepEqual(cur, next) {
		result = "unchanged"
	}
	s.m.reloads.WithLabelValues(result).Inc()
	attrs := []any{"result", result, "added", added, "removed", removed, "changed", changed}
	if len(restart) > 0 {
		attrs = append(attrs, "needs_restart", strings.Join(restart, "; "))
	}
	s.log.Info("config reloaded", attrs...)
	return nil
}

// fixed reports the settings that differ between cur and next but cannot
// change while the proxy runs, and gives next their running values.
func fixed(cur, next *Config) []string {
	var out []string
	keep := func(name string, a, b any, reset func()) {
		if !reflect.DeepEqual(a, b) {
			out = append(out, fmt.Sprintf("%s (running %v, file %v)", name, a, b))
			reset()
		}
	}
	keep("listen", cur.Listen, next.Listen, func() { next.Listen = cur.Listen })
	keep("admin.listen", cur.Admin.Listen, next.Admin.Listen, func() { next.Admin.Listen = cur.Admin.Listen })
	keep("policy", cur.Policy, next.Policy, func() { next.Policy = cur.Policy })
	keep("tie_margin", cur.TieMargin, next.TieMargin, func() { next.TieMargin = cur.TieMargin })
	keep("block_tokens", cur.BlockTokens, next.BlockTokens, func() { next.BlockTokens = cur.BlockTokens })
	keep("bytes_per_token", cur.BytesPerToken, next.BytesPerToken, func() { next.BytesPerToken = cur.BytesPerToken })
	keep("rtt_alpha", cur.RTTAlpha, next.RTTAlpha, func() { next.RTTAlpha = cur.RTTAlpha })
	keep("online_rates", cur.OnlineRates, next.OnlineRates, func() { next.OnlineRates = cur.OnlineRates })
	keep("max_attempts", cur.MaxAttempts, next.MaxAttempts, func() { next.MaxAttempts = cur.MaxAttempts })
	keep("connect_timeout", cur.ConnectTimeout, next.ConnectTimeout, func() { next.ConnectTimeout = cur.ConnectTimeout })
	keep("seed", cur.Seed, next.Seed, func() { next.Seed = cur.Seed })
	keep("ttft_slo", cur.TTFTSLO, next.TTFTSLO, func() { next.TTFTSLO = cur.TTFTSLO })
	keep("region", cur.Region, next.Region, func() { next.Region = cur.Region })
	keep("mesh", cur.Mesh, next.Mesh, func() { next.Mesh = cur.Mesh })
	keep("admission", cur.Admission, next.Admission, func() { next.Admission = cur.Admission })
	keep("admission_queue", cur.AdmissionQueue, next.AdmissionQueue, func() { next.AdmissionQueue = cur.AdmissionQueue })
	keep("upstream_tls", cur.UpstreamTLS, next.UpstreamTLS, func() { next.UpstreamTLS = cur.UpstreamTLS })
	return out
}

// applyParams sets the running policy's parameters from a config.
func (s *Server) applyParams(next Config) error {
	p, ok := s.policy.(policy.Tunable)
	if !ok {
		if len(next.Params[s.policy.Name()]) > 0 {
			return fmt.Errorf("policy %s takes no parameters while it runs", s.policy.Name())
		}
		return nil
	}
	v := next.PolicyOptions(s.policy.Name()).Params
	if maps.Equal(v, p.Params()) {
		return nil
	}
	return p.SetParams(v)
}

// applyReplicas makes the config's replicas the fleet's config replicas.
func (s *Server) applyReplicas(want []ReplicaConfig) (added, removed, changed []string) {
	desired := map[string]ReplicaConfig{}
	for _, rc := range want {
		desired[rc.ID] = rc
	}
	for id, u := range s.upstreams() {
		if _, ok := desired[id]; !ok && u.source == sourceConfig && s.rt.Has(id) {
			if st, err := s.rt.Replica(id); err == nil && st.State == router.Removing {
				continue // already leaving
			}
			s.removeQuietly(id)
			removed = append(removed, id)
		}
	}
	for _, rc := range want {
		id := rc.ID
		u := s.upstream(id)
		st, err := s.rt.Replica(id)
		if err != nil || u == nil {
			if err := s.AddReplica(rc, sourceConfig); err != nil {
				s.log.Error("replica not added", "replica", id, "error", err)
				continue
			}
			added = append(added, id)
			continue
		}
		if u.source != sourceConfig {
			s.log.Error("replica not added: its id is taken", "replica", id, "by", u.source)
			continue
		}
		touched := false
		if st.State == router.Removing {
			s.rt.Undrain(id) // listed again while it was leaving: it stays
			touched = true
		}
		switch {
		case u.cfg == rc:
		case u.cfg.URL != rc.URL:
			if err := s.replaceReplica(rc, sourceConfig); err != nil {
				s.log.Error("replica not replaced", "replica", id, "error", err)
				continue
			}
			touched = true
		default:
			if err := s.reconfigure(rc); err != nil {
				s.log.Error("replica not reconfigured", "replica", id, "error", err)
				continue
			}
			touched = true
		}
		if touched {
			changed = append(changed, id)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	slices.Sort(changed)
	return added, removed, changed
}

// reconfigure applies a replica's changed settings (not its URL), keeping
// what the router observed of it.
func (s *Server) reconfigure(rc ReplicaConfig) error {
	if err := s.rt.Reconfigure(routerConfig(rc)); err != nil {
		return err
	}
	s.upMu.Lock()
	defer s.upMu.Unlock()
	old := s.upstream(rc.ID)
	if old == nil {
		return fmt.Errorf("replica %s left meanwhile", rc.ID)
	}
	old.halt()
	key, err := replicaKey(rc)
	if err != nil {
		return err
	}
	u := newUpstream(rc, old.source)
	u.apiKey = key
	s.setUpstream(rc.ID, u)
	s.startLoops(u)
	return nil
}

// pollConfig reloads the config file when its modification time changes.
func (s *Server) pollConfig(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.Config().ConfigPoll):
		}
		s.reloadMu.Lock()
		changed := !s.fileMod.Equal(modTime(s.path))
		s.reloadMu.Unlock()
		if changed {
			_ = s.Reload()
		}
	}
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}
