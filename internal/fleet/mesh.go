package fleet

import (
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// joinMesh connects to the mesh bus (running the embedded NATS server
// first, if the config asks for one).
func (f *Fleet) joinMesh(mc mesh.Config, region string) error {
	if mc.Name == "" {
		mc.Name = mesh.DefaultName(region)
	}
	if mc.Embed != "" {
		url, stop, err := mesh.Serve(mc.Embed)
		if err != nil {
			return err
		}
		f.nats = stop
		if mc.URL == "" {
			mc.URL = url
		}
	}
	b, err := mesh.Connect(mc, f.rt, f.Now, f.log)
	if err != nil {
		if f.nats != nil {
			f.nats()
		}
		return err
	}
	f.bus, f.abortGrace = b, mc.Defaults().AbortGrace
	f.log.Info("joined the mesh", "name", mc.Name, "url", mc.URL)
	return nil
}

// shared makes ts's budgets the mesh's, if the router is in one (at start
// and on a reload): each router charges what the others charged.
func (f *Fleet) shared(ts *tenant.Set) *tenant.Set {
	if ts != nil && f.bus != nil {
		ts.Share(f.bus.Charged)
	}
	return ts
}

// leaveMesh closes the bus and the embedded NATS server.
func (f *Fleet) leaveMesh() {
	if f.bus != nil {
		f.bus.Close()
	}
	if f.nats != nil {
		f.nats()
	}
}
