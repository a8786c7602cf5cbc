package discover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// lookupTimeout bounds each lookup, whatever the group's interval: long
// enough for Go's resolver, which waits 5 s for a nameserver that does not
// answer (resolv.conf's default timeout) before it asks the next, to hear
// the second. A slow lookup only delays the next; the group keeps its last
// set meanwhile.
const lookupTimeout = 12 * time.Second

// Watcher re-resolves groups and reports their endpoint sets.
//
// Failures follow Envoy's STRICT_DNS cluster: a transient failure
// (timeout, SERVFAIL, no server reachable) keeps the group's last known
// set, and is logged once per streak of failures, not every interval; a
// definite "no such host" or an empty answer replaces the set with an
// empty one (the service scaled to zero or is gone; onChange gets a nil
// slice), which is logged. Each lookup is bounded by lookupTimeout (12 s).
//
// Concurrency: NewWatcher starts nothing. Run starts one goroutine per
// group and returns only after all of them have ended, so onChange is
// never called after Run returns. onChange calls are serialized across all
// groups (the callback need not be safe for concurrent use) and in order
// for each group; a slow callback delays the other groups' updates. The
// slice handed to onChange is the callee's to keep. Run may be called only
// once.
type Watcher struct {
	groups   []Group
	r        Resolver
	onChange func(group int, eps []Endpoint)
	log      *slog.Logger

	mu      sync.Mutex // serializes onChange
	started atomic.Bool
}

// NewWatcher returns a watcher of groups (their defaults applied) that
// calls onChange with a group's index in groups and its endpoints: once
// with the group's first definite answer, then whenever the set changes.
// A nil r means Go's own resolver with StrictErrors set (see [Resolver]);
// a nil log discards. It fails if a group is invalid or onChange is nil.
func NewWatcher(groups []Group, r Resolver, onChange func(group int, eps []Endpoint), log *slog.Logger) (*Watcher, error) {
	if onChange == nil {
		return nil, errors.New("discover: onChange is nil")
	}
	gs := make([]Group, len(groups))
	for i, g := range groups {
		if err := g.Validate(); err != nil {
			return nil, fmt.Errorf("group %d: %w", i, err)
		}
		gs[i] = g.Defaults()
	}
	if r == nil {
		r = &net.Resolver{PreferGo: true, StrictErrors: true}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{groups: gs, r: r, onChange: onChange, log: log}, nil
}

// Run resolves every group at once, then each on its own interval
// (measured from the end of its previous lookup), until ctx ends; then it
// returns nil. It returns an error only if called a second time.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("discover: Watcher.Run called twice")
	}
	var wg sync.WaitGroup
	for i := range w.groups {
		wg.Go(func() { w.watch(ctx, i) })
	}
	wg.Wait()
	return nil
}

// watch is group i's loop.
func (w *Watcher) watch(ctx context.Context, i int) {
	g := w.groups[i]
	log := w.log.With("group", i, "name", g.Name())
	var (
		last    []Endpoint
		known   bool // last holds a definite answer
		failing bool // in a streak of transient failures
	)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		eps, err := Resolve(lctx, w.r, g)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !failing {
				log.Warn("discover: lookup failed; keeping the last known endpoints", "err", err, "kept", len(last), "known", known)
				failing = true
			}
		} else {
			if failing {
				log.Info("discover: lookup recovered")
				failing = false
			}
			if !known || !slices.Equal(eps, last) {
				if len(eps) == 0 {
					log.Info("discover: no endpoints (no such host or empty answer)", "was", len(last))
				} else {
					log.Info("discover: endpoints changed", "n", len(eps), "was", len(last))
				}
				known, last = true, eps
				w.mu.Lock()
				w.onChange(i, slices.Clone(eps))
				w.mu.Unlock()
			}
		}
		t.Reset(g.Interval)
	}
}
