package fleet

import "github.com/gorgo-llm/gorgo/internal/mesh"

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

// leaveMesh closes the bus and the embedded NATS server.
func (f *Fleet) leaveMesh() {
	if f.bus != nil {
		f.bus.Close()
	}
	if f.nats != nil {
		f.nats()
	}
}
