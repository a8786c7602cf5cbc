package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/gorgo-llm/gorgo/internal/yamlfile"
)

// A Param is one of a policy's parameters: a non-negative weight of its
// cost. A policy registers its parameters (Info.Params); the config file,
// the command line, the tuner and the admin API read and set them by name,
// through the registry, without knowing the policy.
type Param struct {
	// Name is what configs, flags, the tuner and the admin API call it.
	Name string
	// Default is its value when none is given.
	Default float64
	// Tune marks a parameter the tuner varies when it is not told which;
	// Min and Max bound its search and Init starts it (0 < Min ≤ Init ≤
	// Max), for any parameter the tuner is asked to vary.
	Tune           bool
	Min, Max, Init float64
}

// Values are parameter values, by name.
type Values map[string]float64

// Clone returns a copy of v.
func (v Values) Clone() Values {
	out := make(Values, len(v))
	for k, x := range v {
		out[k] = x
	}
	return out
}

// A Tunable policy has parameters that can change while it routes: the
// next decision uses what SetParams set.
type Tunable interface {
	Policy
	// Params returns the values the next decision uses.
	Params() Values
	// SetParams sets every parameter; it refuses values Resolve refuses.
	SetParams(Values) error
}

// A Tuner is a policy that tunes another's parameters as it routes (the
// online tuner): they are shown, and set only as its start.
type Tuner interface {
	Policy
	// Base names the policy whose parameters it tunes.
	Base() string
	// Incumbent returns the best values so far.
	Incumbent() Values
	// StartFrom makes an operator's values of some of the base's
	// parameters the incumbent and the tuner's start from then on (the
	// others keep theirs); it refuses values the base refuses.
	StartFrom(Values) error
}

// Param returns the policy's parameter of that name.
func (i Info) Param(name string) (Param, bool) {
	k := slices.IndexFunc(i.Params, func(p Param) bool { return p.Name == name })
	if k < 0 {
		return Param{}, false
	}
	return i.Params[k], true
}

// names lists the policy's parameter names, in order.
func (i Info) names() string {
	var out []string
	for _, p := range i.Params {
		out = append(out, p.Name)
	}
	return strings.Join(out, ", ")
}

// Defaults returns the policy's default values.
func (i Info) Defaults() Values {
	v := make(Values, len(i.Params))
	for _, p := range i.Params {
		v[p.Name] = p.Default
	}
	return v
}

// Resolve returns every parameter's value: given's where it has one, the
// default elsewhere. A name the policy does not have, or a value that is
// negative or not finite, is an error.
func (i Info) Resolve(given Values) (Values, error) {
	v := i.Defaults()
	for name, x := range given {
		if _, ok := i.Param(name); !ok {
			if len(i.Params) == 0 {
				return nil, fmt.Errorf("policy %s has no parameters (given %s)", i.Name, name)
			}
			return nil, fmt.Errorf("policy %s has no parameter %q (valid: %s)", i.Name, name, i.names())
		}
		if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("policy %s: %s must be finite and non-negative, got %v", i.Name, name, x)
		}
		v[name] = x
	}
	return v, nil
}

// Format writes values as Parse reads them, in the policy's order, to 4
// significant digits: "rtt=0.276,queue=0.5".
func (i Info) Format(v Values) string {
	var b strings.Builder
	for _, p := range i.Params {
		x, ok := v[p.Name]
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.Name + "=" + strconv.FormatFloat(x, 'g', 4, 64))
	}
	return b.String()
}

// Format writes the named policy's values (see Info.Format).
func Format(name string, v Values) string {
	i, _ := Lookup(name)
	return i.Format(v)
}

// FileKey is the key of a parameters file that names whose parameters it
// holds ({"policy": "gorgo-ms", "rtt": X, ...}, as gorgo tune writes it).
const FileKey = "policy"

// Parse reads values written "rtt=X,queue=Y" (a parameter not given keeps
// its value in base) or, if s names a file, a JSON object {"rtt":X,...},
// which may name its policy (FileKey), refused if another; the result is
// resolved (see Resolve).
func (i Info) Parse(s string, base Values) (Values, error) {
	v := base.Clone()
	if !strings.Contains(s, "=") {
		data, err := yamlfile.ReadFile(s)
		if err != nil {
			return nil, fmt.Errorf("%s's parameters: want %s or a JSON file: %w", i.Name, i.Example(), err)
		}
		var in map[string]json.RawMessage
		if err := json.NewDecoder(bytes.NewReader(data)).Decode(&in); err != nil {
			return nil, fmt.Errorf("parameters file %s: want a JSON object {%q: X, ...}", s, i.Params[0].Name)
		}
		for k, raw := range in {
			if k == FileKey {
				// Whose parameters they are (gorgo tune writes it): gorgo's
				// and gorgo-ms's have the same names.
				var name string
				if json.Unmarshal(raw, &name) != nil || Canonical(name) != i.Name {
					return nil, fmt.Errorf("parameters file %s holds the parameters of %s, not %s", s, raw, i.Name)
				}
				continue
			}
			var x float64
			if err := json.Unmarshal(raw, &x); err != nil {
				return nil, fmt.Errorf("parameters file %s: %s: %s is not a number", s, k, raw)
			}
			v[k] = x
		}
		return i.Resolve(v)
	}
	for _, part := range strings.Split(s, ",") {
		k, x, ok := strings.Cut(strings.TrimSpace(part), "=")
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s's parameters: bad term %q (want %s)", i.Name, part, i.Example())
		}
		v[strings.TrimSpace(k)] = f
	}
	return i.Resolve(v)
}

// Example shows how the parameters are written: "rtt=X,queue=X".
func (i Info) Example() string {
	var out []string
	for _, p := range i.Params {
		out = append(out, p.Name+"=X")
	}
	return strings.Join(out, ",")
}

// HasParams reports whether the named policy (or alias) has parameters.
func HasParams(name string) bool {
	i, ok := Lookup(name)
	return ok && len(i.Params) > 0
}

// WithParams lists the policies that have parameters, sorted.
func WithParams() []string {
	var out []string
	for _, n := range Names() {
		if HasParams(n) {
			out = append(out, n)
		}
	}
	return out
}

// Weights are the gorgo family's parameters: the RTT and queue weights of
// a cost (the prefill weight is 1) and, for gorgo-e2e, its decode terms:
// Decode the stall a request's prefill imposes on the requests decoding,
// ITL its own decode time. A policy with fewer of them leaves the rest 0.
type Weights struct {
	RTT, Queue, Decode, ITL float64
}

// get returns the weight of that parameter name (0 for none).
func (w Weights) get(name string) float64 {
	switch name {
	case "rtt":
		return w.RTT
	case "queue":
		return w.Queue
	case "decode":
		return w.Decode
	case "itl":
		return w.ITL
	}
	return 0
}

// weighted holds the weights of a policy of the gorgo family, which
// SetParams may change while it routes: the next decision uses them.
type weighted struct {
	info Info // the policy's name and parameters
	w    atomic.Pointer[Weights]
}

// init makes p the weights of the registered policy name, set from v.
func (p *weighted) init(name string, v Values) error {
	i, _ := Lookup(name)
	p.info = Info{Name: i.Name, Params: i.Params}
	return p.SetParams(v)
}

// Params returns the values the next decision uses.
func (p *weighted) Params() Values {
	w := p.w.Load()
	v := make(Values, len(p.info.Params))
	for _, q := range p.info.Params {
		v[q.Name] = w.get(q.Name)
	}
	return v
}

// SetParams validates and sets the weights of the next decisions.
func (p *weighted) SetParams(v Values) error {
	v, err := p.info.Resolve(v)
	if err != nil {
		return err
	}
	w := Weights{RTT: v["rtt"], Queue: v["queue"], Decode: v["decode"], ITL: v["itl"]}
	p.w.Store(&w)
	return nil
}
