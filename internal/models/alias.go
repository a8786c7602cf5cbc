package models

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	"gopkg.in/yaml.v3"
)

// Target is a served name an alias sends a share of its requests to.
type Target struct {
	Model  string  `json:"model"`
	Weight float64 `json:"weight"`
}

// Alias is a client-facing name of the router's own: a request for it goes
// to one of its targets (served names), in proportion to their weights (a
// canary split), a session staying on the target it first got.
type Alias struct {
	Name    string   `json:"name"`
	Targets []Target `json:"targets"`
}

// Spec is an alias's targets as the config file gives them: one served
// name (all of its requests), or a map of served names to weights.
//
//	models:
//	  small: llama-3.1-8b
//	  chat: {llama-3.1-70b: 90, llama-3.3-70b: 10}
type Spec []Target

// UnmarshalYAML reads a scalar (one target, weight 1) or a mapping of
// targets to weights.
func (s *Spec) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*s = Spec{{Model: n.Value, Weight: 1}}
		return nil
	case yaml.MappingNode:
		var m map[string]float64
		if err := n.Decode(&m); err != nil {
			return err
		}
		*s = (*s)[:0]
		for k, w := range m {
			*s = append(*s, Target{Model: k, Weight: w})
		}
		slices.SortFunc(*s, func(a, b Target) int { return cmp.Compare(a.Model, b.Model) })
		return nil
	}
	return fmt.Errorf("line %d: an alias is a served model's name or a map of names to weights", n.Line)
}

// UnmarshalJSON reads a string (one target, weight 1) or an object of
// targets to weights, as UnmarshalYAML does.
func (s *Spec) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		*s = Spec{{Model: name, Weight: 1}}
		return nil
	}
	var m map[string]float64
	if err := json.Unmarshal(b, &m); err != nil {
		return errors.New("an alias is a served model's name or an object of names to weights")
	}
	*s = (*s)[:0]
	for k, w := range m {
		*s = append(*s, Target{Model: k, Weight: w})
	}
	slices.SortFunc(*s, func(a, b Target) int { return cmp.Compare(a.Model, b.Model) })
	return nil
}

// MaxAliases bounds the aliases a router keeps (each is a metrics label).
const MaxAliases = 256

// ParseAliases turns the config's models: map into aliases, sorted by name,
// each one's targets by served name. An alias needs at least one target of
// positive weight; weights are finite and not negative; an alias cannot
// target another alias, nor itself.
func ParseAliases(specs map[string]Spec) ([]Alias, error) {
	if len(specs) > MaxAliases {
		return nil, fmt.Errorf("models: %d aliases, more than %d", len(specs), MaxAliases)
	}
	out := make([]Alias, 0, len(specs))
	for name, spec := range specs {
		a := Alias{Name: name, Targets: slices.Clone(spec)}
		slices.SortFunc(a.Targets, func(x, y Target) int { return cmp.Compare(x.Model, y.Model) })
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y Alias) int { return cmp.Compare(x.Name, y.Name) })
	return out, CheckAliases(out)
}

// CheckAliases validates aliases (as ParseAliases does).
func CheckAliases(as []Alias) error {
	if len(as) > MaxAliases {
		return fmt.Errorf("models: %d aliases, more than %d", len(as), MaxAliases)
	}
	names := map[string]bool{}
	for _, a := range as {
		if err := checkName(a.Name); err != nil {
			return err
		}
		if names[a.Name] {
			return fmt.Errorf("models: alias %q given twice", a.Name)
		}
		names[a.Name] = true
	}
	var errs []error
	for _, a := range as {
		total := 0.0
		seen := map[string]bool{}
		for _, t := range a.Targets {
			switch {
			case checkName(t.Model) != nil:
				errs = append(errs, fmt.Errorf("models: alias %q: a target has no name or too long a one", a.Name))
			case names[t.Model]:
				errs = append(errs, fmt.Errorf("models: alias %q targets %q, an alias: targets are served names", a.Name, t.Model))
			case seen[t.Model]:
				errs = append(errs, fmt.Errorf("models: alias %q names %q twice", a.Name, t.Model))
			case t.Weight < 0 || math.IsNaN(t.Weight) || math.IsInf(t.Weight, 0):
				errs = append(errs, fmt.Errorf("models: alias %q: the weight of %q must be a finite number, not negative", a.Name, t.Model))
			}
			seen[t.Model] = true
			total += t.Weight
		}
		if !(total > 0) || math.IsInf(total, 0) {
			errs = append(errs, fmt.Errorf("models: alias %q needs a target of positive weight", a.Name))
		}
	}
	if len(errs) > 0 {
		return errs[0] // one line: the first problem (it once joined them, a line each)
	}
	return nil
}

// Resolver turns a client's model name into the served name the request
// goes to: an alias's target, chosen by weight, or the name itself. A
// request with a session (X-Session-ID, or the body's user) stays on the
// target its session first got: new sessions are placed by weighted
// rendezvous hashing of the session (the same on every router and after a
// restart, and a weight change moves only the sessions it must), and
// remembered, so that a later change of the split does not move them. A
// request without one is placed by smooth weighted round robin, which
// keeps the split exact over any run of requests.
//
// It is safe for concurrent use.
type Resolver struct {
	mu      sync.Mutex
	aliases map[string]*split
	list    []Alias
	// sessions remembers sessions' targets in two generations (cur, then
	// old): a lookup in old moves the entry to cur; when cur is full, old
	// is dropped and cur becomes old. At most 2·sessionCap entries.
	cur, old map[sessionKey]string
}

// sessionKey is an alias and a session's hash: a client's session id may
// be long (the body's user), and is not kept.
type sessionKey struct {
	alias   string
	session uint64
}

// sessionCap is how many sessions a generation of the sticky table holds.
const sessionCap = 1 << 15

type split struct {
	name    string
	targets []Target
	current []float64 // smooth weighted round robin's state
	total   float64
}

// NewResolver returns a resolver over aliases (which must have passed
// CheckAliases).
func NewResolver(aliases []Alias) *Resolver {
	r := &Resolver{cur: map[sessionKey]string{}, old: map[sessionKey]string{}}
	r.Set(aliases)
	return r
}

// Set replaces the aliases (a reload, the admin API). Sessions keep their
// targets while those stay targets of positive weight of the same alias.
func (r *Resolver) Set(aliases []Alias) {
	m := make(map[string]*split, len(aliases))
	for _, a := range aliases {
		s := &split{name: a.Name, targets: slices.Clone(a.Targets), current: make([]float64, len(a.Targets))}
		for _, t := range a.Targets {
			s.total += t.Weight
		}
		m[a.Name] = s
	}
	list := slices.Clone(aliases)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aliases, r.list = m, list
}

// Aliases returns the aliases, sorted by name.
func (r *Resolver) Aliases() []Alias {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// Resolve returns the served name a request for name from session goes to
// ("" for none), and whether name is an alias.
func (r *Resolver) Resolve(name, session string) (string, bool) {
	return r.resolve(name, session, false)
}

// Peek returns what Resolve would, changing nothing (a dry run).
func (r *Resolver) Peek(name, session string) (string, bool) {
	return r.resolve(name, session, true)
}

func (r *Resolver) resolve(name, session string, dry bool) (string, bool) {
	var h uint64
	if session != "" {
		h = xxhash.Sum64String(session) // outside the lock
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.aliases[name]
	if !ok {
		return name, false
	}
	if session == "" {
		if dry {
			c := *s
			c.current = slices.Clone(s.current)
			s = &c
		}
		return s.next(), true
	}
	k := sessionKey{s.name, h}
	t, ok := r.cur[k]
	if !ok {
		if t, ok = r.old[k]; ok && !dry {
			r.remember(k, t)
		}
	}
	if ok && s.weight(t) > 0 {
		return t, true
	}
	t = s.rendezvous(h)
	if !dry {
		r.remember(k, t)
	}
	return t, true
}

func (r *Resolver) remember(k sessionKey, t string) {
	if len(r.cur) >= sessionCap {
		r.old, r.cur = r.cur, make(map[sessionKey]string, sessionCap)
	}
	r.cur[k] = t
}

// next is smooth weighted round robin (as nginx's upstreams): every
// target's current weight grows by its weight, the largest is chosen and
// falls by the total.
func (s *split) next() string {
	best := -1
	for i, t := range s.targets {
		s.current[i] += t.Weight
		if t.Weight > 0 && (best < 0 || s.current[i] > s.current[best]) {
			best = i
		}
	}
	s.current[best] -= s.total
	return s.targets[best].Model
}

// rendezvous places a session by weighted rendezvous hashing: the target
// of least −ln(u)/w, u a uniform draw from the hash of the session's hash
// and the target's name.
func (s *split) rendezvous(session uint64) string {
	best, bestScore := -1, math.Inf(1)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], session)
	for i, t := range s.targets {
		if t.Weight <= 0 {
			continue
		}
		var d xxhash.Digest
		d.Reset()
		_, _ = d.Write(b[:])
		_, _ = d.WriteString(t.Model)
		u := (float64(d.Sum64()>>11) + 0.5) / (1 << 53)
		if score := -math.Log(u) / t.Weight; score < bestScore {
			best, bestScore = i, score
		}
	}
	return s.targets[best].Model
}

func (s *split) weight(model string) float64 {
	for _, t := range s.targets {
		if t.Model == model {
			return t.Weight
		}
	}
	return 0
}
