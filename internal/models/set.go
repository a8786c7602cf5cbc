// Package models is what a gorgo router knows of the models its fleet
// serves: each replica's served names (base models and the LoRA adapters
// on them) as the engine lists them at GET /v1/models or the config says
// (Set, ParseList), the router's own client-facing names, aliases and
// canary splits among served names (Aliases, Resolver), and the bounded
// set of names metrics are labelled with (Labels).
//
// The package holds no clock and draws no random numbers: a Resolver's
// weighted round robin and its sessions' hashing are deterministic, so
// the simulator, the proxy and tests agree.
package models

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Model is one name a replica serves.
type Model struct {
	// ID is the name clients ask for (the request's "model").
	ID string `json:"id"`
	// Parent is, for a LoRA adapter, the base model it runs on (vLLM's
	// /v1/models "parent"); empty for a base model.
	Parent string `json:"parent,omitempty"`
	// Root is what the engine says the name stands for (a path or a
	// Hugging Face id); informational.
	Root string `json:"root,omitempty"`
}

// IsAdapter reports whether the name is a LoRA adapter on a base model.
func (m Model) IsAdapter() bool { return m.Parent != "" }

// Limits on what one replica may claim to serve: a hostile or broken
// replica must not grow the router (each name costs a map entry here and
// in the catalog, and may become a metrics label).
const (
	// MaxPerReplica is the most names a replica's set keeps; a list with
	// more is refused.
	MaxPerReplica = 1024
	// MaxNameBytes is the longest name kept.
	MaxNameBytes = 256
)

// Set is what one replica serves: base models and adapters, by name. It
// is immutable once built, and safe for concurrent use.
type Set struct {
	byID map[string]Model
	list []Model // sorted by ID
}

// NewSet builds a set from a list of names. A name listed twice keeps its
// last entry; an empty name, one longer than MaxNameBytes, an adapter whose
// parent is not in the list (as a base), or more than MaxPerReplica names
// is an error.
func NewSet(ms []Model) (*Set, error) {
	if len(ms) > MaxPerReplica {
		return nil, fmt.Errorf("models: %d names, more than the %d a replica may list", len(ms), MaxPerReplica)
	}
	s := &Set{byID: make(map[string]Model, len(ms))}
	for _, m := range ms {
		if err := checkName(m.ID); err != nil {
			return nil, err
		}
		if len(m.Root) > MaxNameBytes {
			m.Root = m.Root[:MaxNameBytes]
		}
		s.byID[m.ID] = m
	}
	for _, m := range s.byID {
		if !m.IsAdapter() {
			continue
		}
		if p, ok := s.byID[m.Parent]; !ok || p.IsAdapter() {
			return nil, fmt.Errorf("models: adapter %q runs on %q, which is not a base model of the list", m.ID, m.Parent)
		}
	}
	for _, m := range s.byID {
		s.list = append(s.list, m)
	}
	slices.SortFunc(s.list, func(a, b Model) int { return cmp.Compare(a.ID, b.ID) })
	return s, nil
}

func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("models: a model has no name")
	case len(name) > MaxNameBytes:
		return fmt.Errorf("models: a name of %d bytes, longer than %d", len(name), MaxNameBytes)
	}
	return nil
}

// Names builds a set of base models (with no adapters) from their names.
func Names(names ...string) (*Set, error) {
	ms := make([]Model, len(names))
	for i, n := range names {
		ms[i] = Model{ID: n}
	}
	return NewSet(ms)
}

// WithAdapters builds a set of base models and adapters as a config gives
// them: the adapters run on the first base model.
func WithAdapters(bases, adapters []string) (*Set, error) {
	ms := make([]Model, 0, len(bases)+len(adapters))
	for _, n := range bases {
		ms = append(ms, Model{ID: n})
	}
	if len(adapters) > 0 && len(bases) == 0 {
		return nil, errors.New("models: adapters need a base model to run on")
	}
	for _, a := range adapters {
		ms = append(ms, Model{ID: a, Parent: bases[0]})
	}
	return NewSet(ms)
}

// Lookup returns the model a request naming name gets on this replica. A
// name not listed as such may be SGLang's BASE:ADAPTER, an adapter named
// together with the base it runs on: it stands for that adapter.
func (s *Set) Lookup(name string) (Model, bool) {
	if s == nil {
		return Model{}, false
	}
	if m, ok := s.byID[name]; ok {
		return m, true
	}
	if i := strings.LastIndexByte(name, ':'); i > 0 {
		if m, ok := s.byID[name[i+1:]]; ok && m.IsAdapter() && m.Parent == name[:i] {
			return m, true
		}
	}
	return Model{}, false
}

// Models returns the set's models, sorted by name. Do not modify it.
func (s *Set) Models() []Model {
	if s == nil {
		return nil
	}
	return s.list
}

// Len is how many names the set holds.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.list)
}

// Bases returns the set's base models' names, sorted.
func (s *Set) Bases() []string {
	var out []string
	for _, m := range s.Models() {
		if !m.IsAdapter() {
			out = append(out, m.ID)
		}
	}
	return out
}

// Adapters returns the set's adapters' names, sorted.
func (s *Set) Adapters() []string {
	var out []string
	for _, m := range s.Models() {
		if m.IsAdapter() {
			out = append(out, m.ID)
		}
	}
	return out
}

// Equal reports whether two sets hold the same models (nil sets are
// equal to each other only).
func (s *Set) Equal(o *Set) bool {
	if s == nil || o == nil {
		return s == o
	}
	return slices.Equal(s.list, o.list)
}

// Without returns the set less one name (and, for a base model, the
// adapters on it), for a replica that answered 404 for it.
func (s *Set) Without(name string) *Set {
	if s == nil {
		return nil
	}
	n := &Set{byID: make(map[string]Model, len(s.byID))}
	for _, m := range s.list {
		if m.ID != name && m.Parent != name {
			n.byID[m.ID] = m
			n.list = append(n.list, m)
		}
	}
	return n
}

// String lists the set's names, adapters as NAME@BASE.
func (s *Set) String() string {
	var b strings.Builder
	for i, m := range s.Models() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m.ID)
		if m.IsAdapter() {
			b.WriteByte('@')
			b.WriteString(m.Parent)
		}
	}
	return b.String()
}

// Union is every name any of the sets serves, each once (the first set's
// entry for a name listed by several): a fleet's catalog. Its Lookup of
// SGLang's BASE:ADAPTER finds that base's adapter, whichever set listed
// the adapter's name first. Nil sets are skipped. Unlike a replica's set
// it has no size limit but the sets'.
func Union(sets ...*Set) *Set {
	u := &Set{byID: map[string]Model{}}
	for _, s := range sets {
		for _, m := range s.Models() {
			if !u.has(m.ID) {
				u.byID[m.ID] = m
				u.list = append(u.list, m)
			}
		}
	}
	// BASE:ADAPTER finds each base's adapter of the name, unless a base is
	// really so named (every real name is in before any of these).
	for _, s := range sets {
		for _, m := range s.Models() {
			if k := m.Parent + ":" + m.ID; m.IsAdapter() && !u.has(k) {
				u.byID[k] = m
			}
		}
	}
	slices.SortFunc(u.list, func(a, b Model) int { return cmp.Compare(a.ID, b.ID) })
	return u
}

func (s *Set) has(name string) bool {
	_, ok := s.byID[name]
	return ok
}
