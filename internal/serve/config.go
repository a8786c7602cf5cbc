package serve

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/yamlfile"
)

// Config is what gorgo serve and gorgo epp read from their YAML file: one
// document, whose top-level keys belong to the fleet (replicas, discover,
// policy, signals, health, admission, mesh), the HTTP front end (listen,
// tls, auth, rate_limit, the request path's limits) and the file itself
// (config_poll), and whose admin: key is the admin listener's. Zero fields
// take the defaults Defaults fills in.
type Config struct {
	fleet.Config `yaml:",inline"`
	Proxy        proxy.Config `yaml:",inline"`
	Admin        admin.Config `yaml:"admin"`
	// ConfigPoll is how often the config file's modification time is
	// checked, and the file reloaded when it changed (default 5 s; negative:
	// never; SIGHUP reloads it at any time).
	ConfigPoll time.Duration `yaml:"config_poll"`
	// Tracing exports OpenTelemetry spans of each request to an OTLP/HTTP
	// collector (off without an endpoint; a change needs a restart).
	Tracing tracing.Config `yaml:"tracing"`
	// TunerState is a file where the online tuner keeps what it learned
	// (tune.State), so that a restart resumes it rather than start again
	// from the config's weights: read at start, written when it changes
	// (at most every 10 s, and at shutdown). Its directory must be
	// writable, and the file each router's own (two writing one would take
	// each other's state). Without it, or for an untuned policy, nothing
	// is kept. A change needs a restart.
	TunerState string `yaml:"tuner_state"`
}

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	c.Config = c.Config.Defaults()
	if c.Proxy.EngineOperations == "" && len(c.Tenants) > 0 {
		// A fleet shared by teams: one client's flush, abort of all,
		// sleep or unload would be every team's (allow says otherwise).
		c.Proxy.EngineOperations = proxy.OperationsRefuse
	}
	c.Proxy = c.Proxy.Defaults()
	c.Admin = c.Admin.Defaults()
	if c.ConfigPoll == 0 {
		c.ConfigPoll = 5 * time.Second
	}
	return c
}

// Validate reports the first problem of a defaulted config; it changes
// nothing.
func (c Config) Validate() error {
	if len(c.Replicas) == 0 && len(c.Discover) == 0 && c.Admin.Listen == admin.Off {
		return fmt.Errorf("config: no replicas, no discover groups and no admin API to add any")
	}
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if err := c.Admin.Validate(); err != nil {
		return err
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	if info, _ := policy.Lookup(c.Policy); c.TunerState != "" && !c.Tuned() && !info.Tuner {
		return fmt.Errorf("config: tuner_state: policy %s runs untuned (tune: false, or --tune=false): there is no state to keep", c.Policy)
	}
	return c.Proxy.Validate()
}

// LoadConfig reads a YAML config file; unknown fields are errors.
func LoadConfig(path string) (Config, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading config: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig decodes a YAML config (name says where it came from, for
// errors); unknown fields are errors, and so is an empty document (a file
// caught half-written by a reload must not empty the fleet). A policy's
// parameters may be given under the key it registered (weights: for
// gorgo's): the registry says which keys those are.
func ParseConfig(data []byte, name string) (Config, error) {
	var f file
	if err := yamlfile.Decode(data, &f); err != nil {
		if err == io.EOF {
			return Config{}, fmt.Errorf("config %s is empty", name)
		}
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	if err := f.readPolicyKeys(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	return f.Config, nil
}

// file is the config as decoded: the config, and the top-level keys no
// field takes, which may be policies' keys.
type file struct {
	Config `yaml:",inline"`
	Keys   map[string]yaml.Node `yaml:",inline"`
}

// readPolicyKeys moves the parameters given under policies' own keys into
// Params (params: wins where both give one); any other unknown key is an
// error, as for the fields.
func (f *file) readPolicyKeys() error {
	for _, key := range slices.Sorted(maps.Keys(f.Keys)) {
		node := f.Keys[key]
		info, ok := policy.ByConfigKey(key)
		if !ok {
			return fmt.Errorf("line %d: field %s not found in the config (policies' parameters: params: or %s)", node.Line, key, strings.Join(policy.ConfigKeys(), ", "))
		}
		var v policy.Values
		if err := node.Decode(&v); err != nil {
			return fmt.Errorf("%s: %w", key, yamlfile.Error(err, &v))
		}
		if v == nil {
			v = policy.Values{}
		}
		if f.Params == nil {
			f.Params = map[string]policy.Values{}
		}
		for k, x := range f.Params[info.Name] {
			v[k] = x
		}
		f.Params[info.Name] = v
	}
	return nil
}
