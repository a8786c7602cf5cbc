package fleet

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// Prepare judges next as the fleet's running config, for a reload: next
// is validated as written (what a restart would read), then the settings
// that cannot change while the fleet runs (see fixed) keep their running
// values and are listed in restart, and next is validated with them. A
// config that fails either is an error and changes nothing (a file told
// it only needs a restart must start);
// otherwise apply makes it the running config: the config's replicas are
// reconciled (Want), the DNS groups re-read, the policy's parameters, the
// intervals (a probe or scrape waiting out the old interval is made once
// the new one has passed since the last), the failure threshold, the
// ejection times and max_ejection_percent take effect at once.
func (f *Fleet) Prepare(next Config) (apply func() (Changes, error), restart []string, err error) {
	next = next.Defaults()
	if err := next.Validate(); err != nil {
		return nil, nil, err
	}
	cur := f.Config()
	restart = fixed(&cur, &next)
	if err := next.Validate(); err != nil {
		return nil, restart, err
	}
	// The running policy's parameters change when the file's values for it
	// do (an edit elsewhere in the file leaves values set through the admin
	// API alone).
	var set func()
	name := f.policy.Name()
	if t, ok := f.policy.(policy.Tuner); ok {
		name = t.Base()
	}
	if !reflect.DeepEqual(cur.Params[name], next.Params[name]) {
		v, _ := policy.Lookup(name)
		resolved, _ := v.Resolve(next.Params[name]) // validated
		switch p := f.policy.(type) {
		case policy.Tunable:
			set = func() { _ = p.SetParams(resolved) }
		case policy.Tuner:
			// The tuner starts from them, as a restart would start it
			// (gorgo serve judges the file's weights as a start before
			// it is applied).
			set = func() {
				if err := p.StartFrom(resolved); err != nil {
					f.log.Error("the tuner cannot start from the file's weights: it keeps its own", "policy", name, "error", err)
					return
				}
				// What it learned is gone: say so (a user's test: the
				// reload's line said nothing of it).
				f.log.Info("the tuner starts from the file's weights", "weights", policy.Format(name, p.Incumbent()))
			}
		default:
			restart = append(restart, fmt.Sprintf("params: policy %s takes none while it runs", name))
			next.Params = keepParams(next.Params, name, cur.Params[name])
		}
	}
	// The tenants change live, their budgets kept (tenant.Set.Carry),
	// unless a tenant's TTFT SLO would turn flow control on or off, which
	// is set up at start.
	var setTenants func()
	if changed := changedTenants(cur.Tenants, next.Tenants); changed != "" {
		if cur.HasSLO() != next.HasSLO() {
			restart = append(restart, "tenants ("+changed+"; a tenant's ttft_slo turns flow control on or off)")
			next.Tenants = cur.Tenants
		} else {
			ts, _ := next.tenants() // validated
			setTenants = func() {
				f.core.SetTenants(f.shared(ts), time.Now())
				// The reload's own line counts replicas: the tenants say
				// here what changed (2026-12-07, a user's test: nothing
				// in the log said so).
				f.log.Info("tenants changed", "what", changed)
			}
		}
	}
	sources := !reflect.DeepEqual(cur.Discover, next.Discover)
	// The aliases change when the file's do (an edit elsewhere leaves those
	// set through the admin API alone).
	var aliases []models.Alias
	setAliases := !reflect.DeepEqual(cur.Models, next.Models)
	if setAliases {
		aliases, _ = models.ParseAliases(next.Models) // validated
	}
	return func() (Changes, error) {
		if set != nil {
			set()
		}
		if setTenants != nil {
			setTenants()
		}
		if setAliases {
			f.aliases.Set(aliases)
		}
		f.cfg.Store(&next)
		if next.ProbeInterval != cur.ProbeInterval || next.ScrapeInterval != cur.ScrapeInterval {
			f.intervalsChanged()
		}
		ch, err := f.Want(SourceConfig, next.Replicas)
		if sources {
			f.setSources(dnsSources(next.Discover, f.resolver, f.log))
		}
		return ch, err
	}, restart, nil
}

// fixed reports the settings that differ between cur and next but cannot
// change while the fleet runs, and gives next their running values.
func fixed(cur, next *Config) []string {
	var out []string
	keep := func(name string, a, b any, reset func()) {
		if !reflect.DeepEqual(a, b) {
			out = append(out, fmt.Sprintf("%s (running %v, file %v)", name, a, b))
			reset()
		}
	}
	keep("policy", cur.Policy, next.Policy, func() { next.Policy = cur.Policy })
	keep("tune", cur.Tuned(), next.Tuned(), func() { next.Tune = cur.Tune })
	keep("tie_margin", cur.TieMargin, next.TieMargin, func() { next.TieMargin = cur.TieMargin })
	keep("block_tokens", cur.BlockTokens, next.BlockTokens, func() { next.BlockTokens = cur.BlockTokens })
	keep("bytes_per_token", cur.BytesPerToken, next.BytesPerToken, func() { next.BytesPerToken = cur.BytesPerToken })
	keep("image_tokens", cur.ImageTokens, next.ImageTokens, func() { next.ImageTokens = cur.ImageTokens })
	keep("audio_tokens_per_second", cur.AudioTokensPerSecond, next.AudioTokensPerSecond, func() { next.AudioTokensPerSecond = cur.AudioTokensPerSecond })
	keep("video_tokens", cur.VideoTokens, next.VideoTokens, func() { next.VideoTokens = cur.VideoTokens })
	keep("rtt_alpha", cur.RTTAlpha, next.RTTAlpha, func() { next.RTTAlpha = cur.RTTAlpha })
	keep("online_rates", cur.OnlineRates, next.OnlineRates, func() { next.OnlineRates = cur.OnlineRates })
	keep("output_estimate", cur.OutputEstimate, next.OutputEstimate, func() { next.OutputEstimate = cur.OutputEstimate })
	keep("max_attempts", cur.MaxAttempts, next.MaxAttempts, func() { next.MaxAttempts = cur.MaxAttempts })
	keep("connect_timeout", cur.ConnectTimeout, next.ConnectTimeout, func() { next.ConnectTimeout = cur.ConnectTimeout })
	keep("seed", cur.Seed, next.Seed, func() { next.Seed = cur.Seed })
	keep("ttft_slo", cur.TTFTSLO, next.TTFTSLO, func() { next.TTFTSLO = cur.TTFTSLO })
	keep("region", cur.Region, next.Region, func() { next.Region = cur.Region })
	keep("mesh", cur.Mesh, next.Mesh, func() { next.Mesh = cur.Mesh })
	keep("admission", cur.Admission, next.Admission, func() { next.Admission = cur.Admission })
	keep("admission_queue", cur.AdmissionQueue, next.AdmissionQueue, func() { next.AdmissionQueue = cur.AdmissionQueue })
	keep("saturation_waiting", cur.SaturationWaiting, next.SaturationWaiting, func() { next.SaturationWaiting = cur.SaturationWaiting })
	keep("upstream_tls", cur.UpstreamTLS, next.UpstreamTLS, func() { next.UpstreamTLS = cur.UpstreamTLS })
	keep("adapter_load_time", cur.AdapterLoadTime, next.AdapterLoadTime, func() { next.AdapterLoadTime = cur.AdapterLoadTime })
	keep("adapter_load_times", cur.AdapterLoadTimes, next.AdapterLoadTimes, func() { next.AdapterLoadTimes = cur.AdapterLoadTimes })
	return out
}

// changedTenants says which tenants the file adds, removes or changes
// ("" if none), by name, for a log line.
func changedTenants(cur, next map[string]tenant.Config) string {
	var added, removed, changed []string
	for name, c := range next {
		if old, ok := cur[name]; !ok {
			added = append(added, name)
		} else if !reflect.DeepEqual(old, c) {
			changed = append(changed, name)
		}
	}
	for name := range cur {
		if _, ok := next[name]; !ok {
			removed = append(removed, name)
		}
	}
	var parts []string
	for _, p := range []struct {
		what  string
		names []string
	}{{"added", added}, {"removed", removed}, {"changed", changed}} {
		if len(p.names) > 0 {
			slices.Sort(p.names)
			parts = append(parts, p.what+" "+strings.Join(p.names, ", "))
		}
	}
	return strings.Join(parts, "; ")
}

// keepParams returns params with name's values set to the running ones.
func keepParams(params map[string]policy.Values, name string, running policy.Values) map[string]policy.Values {
	out := maps.Clone(params)
	if out == nil {
		out = map[string]policy.Values{}
	}
	if running == nil {
		delete(out, name)
	} else {
		out[name] = running
	}
	return out
}
