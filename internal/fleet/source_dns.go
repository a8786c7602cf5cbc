package fleet

import (
	"context"
	"log/slog"

	"github.com/gorgo-llm/gorgo/internal/discover"
)

// dnsGroup is a DNS group as a source: the name re-resolved on its
// interval, each address (or SRV target and port) a replica whose id is
// the name and the address (see discover.Watcher for how failures keep the
// last set).
type dnsGroup struct {
	group    discover.Group
	resolver discover.Resolver
	log      *slog.Logger
}

// dnsSources are the config's DNS groups as sources.
func dnsSources(groups []discover.Group, r discover.Resolver, log *slog.Logger) []Source {
	var out []Source
	for _, g := range groups {
		out = append(out, &dnsGroup{group: g, resolver: r, log: log})
	}
	return out
}

func (d *dnsGroup) Name() string { return SourceDNS + d.group.Name() }

func (d *dnsGroup) Watch(ctx context.Context, want func([]ReplicaConfig)) {
	w, err := discover.NewWatcher([]discover.Group{d.group}, d.resolver, func(_ int, eps []discover.Endpoint) {
		reps := make([]ReplicaConfig, 0, len(eps))
		for _, ep := range eps {
			g := d.group
			reps = append(reps, ReplicaConfig{ID: ep.ID, URL: ep.URL, Region: ep.Region, Profile: ep.Profile,
				Models: g.Models, Adapters: g.Adapters, MaxLoRAs: g.MaxLoRAs})
		}
		want(reps)
	}, d.log.With("component", "discover"))
	if err != nil { // the config was validated: cannot happen
		d.log.Error("discover group not watched", "group", d.group.Name(), "error", err)
		return
	}
	_ = w.Run(ctx)
}
