package fleet

import (
	"context"
	"reflect"
)

// A Source is a place replicas come from that the fleet watches: each DNS
// group is one, and so would be a Kubernetes EndpointSlice or a Consul
// service. Watch tells want the whole set of replicas the source wants,
// once it knows it and on every change, until ctx ends; a source that
// cannot tell (a lookup that failed) says nothing, and its last set stands.
// The replicas a source brings are its own (Want). A new source is a type
// of this interface; the config lists it.
type Source interface {
	// Name names the source ("dns:vllm.ns.svc").
	Name() string
	// Watch reports the source's replicas to want until ctx ends.
	Watch(ctx context.Context, want func([]ReplicaConfig))
}

// running is a source and its watch.
type running struct {
	src  Source
	stop context.CancelFunc // nil while not watching
	done chan struct{}
}

// setSources makes srcs the watched sources: new ones start (when the
// fleet runs), changed ones restart (their first set is reconciled with the
// last, so replicas that stay keep their state), and those no longer listed
// stop and take their replicas with them.
func (f *Fleet) setSources(srcs []Source) {
	keep := map[string]Source{}
	for _, s := range srcs {
		keep[s.Name()] = s
	}
	var stopped []*running
	f.mu.Lock()
	for name, r := range f.sources {
		if s, ok := keep[name]; !ok || !reflect.DeepEqual(s, r.src) {
			stopped = append(stopped, r)
			delete(f.sources, name)
		}
	}
	f.mu.Unlock()
	// Stop them outside the lock: their last report may be waiting for it.
	for _, r := range stopped {
		r.halt()
		if _, ok := keep[r.src.Name()]; !ok {
			f.Want(r.src.Name(), nil)
			f.mu.Lock()
			delete(f.wishes, r.src.Name())
			f.mu.Unlock()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, s := range keep {
		if f.sources[name] == nil {
			r := &running{src: s}
			f.sources[name] = r
			f.startSource(r)
		}
	}
}

// startSource starts a source's watch when the fleet runs. Call with f.mu
// held.
func (f *Fleet) startSource(r *running) {
	if f.run == nil || r.stop != nil {
		return
	}
	ctx, cancel := context.WithCancel(f.run)
	r.stop, r.done = cancel, make(chan struct{})
	f.loops.Add(1)
	go func() {
		defer f.loops.Done()
		defer close(r.done)
		r.src.Watch(ctx, func(want []ReplicaConfig) {
			if ctx.Err() == nil {
				f.Want(r.src.Name(), want)
			}
		})
	}()
}

// halt stops the watch and waits for its last report.
func (r *running) halt() {
	if r.stop != nil {
		r.stop()
		<-r.done
	}
}
