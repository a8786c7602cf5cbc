package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// MaxListBytes bounds the GET /v1/models answer a router reads.
const MaxListBytes = 1 << 20

// ParseList reads an engine's GET /v1/models answer, OpenAI's list
// ({"object":"list","data":[{"id":...},...]}) as vLLM and SGLang give it:
// a LoRA adapter is an entry whose "parent" names the base model it runs on
// (vLLM; SGLang likewise lists its adapters with their base as parent). An
// adapter whose parent is not listed as a base runs on the first base
// listed. Entries without an id, or with one longer than MaxNameBytes, are
// skipped (an adapter on a parent that long runs on the first base); more than
// MaxPerReplica names is an error.
func ParseList(body []byte) (*Set, error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   *string `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("models: the model list is not OpenAI's: %v", err)
	}
	if len(list.Data) > MaxPerReplica {
		return nil, fmt.Errorf("models: %d names, more than the %d a replica may list", len(list.Data), MaxPerReplica)
	}
	ms := make([]Model, 0, len(list.Data))
	first := ""
	for _, d := range list.Data {
		if d.ID == "" || len(d.ID) > MaxNameBytes {
			continue // one bad entry does not cost the replica its whole list
		}
		m := Model{ID: d.ID}
		if d.Root != nil {
			m.Root = *d.Root
		}
		if d.Parent != nil && *d.Parent != "" && *d.Parent != d.ID {
			m.Parent = *d.Parent
		} else if first == "" {
			first = d.ID
		}
		ms = append(ms, m)
	}
	bases := map[string]bool{}
	for _, m := range ms {
		if !m.IsAdapter() {
			bases[m.ID] = true
		}
	}
	if len(ms) == 0 {
		return nil, errors.New("models: the model list names no model")
	}
	ms = slices.DeleteFunc(ms, func(m Model) bool { return m.IsAdapter() && first == "" })
	for i := range ms {
		if ms[i].IsAdapter() && !bases[ms[i].Parent] {
			ms[i].Parent = first
		}
	}
	return NewSet(ms)
}

// Card is one entry of a router's own GET /v1/models answer.
type Card struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root,omitempty"`
	Parent  string `json:"parent,omitempty"`
}

// List is a router's GET /v1/models answer.
type List struct {
	Object string `json:"object"`
	Data   []Card `json:"data"`
}

// NewCard is the entry of a served model or an alias.
func NewCard(m Model, created time.Time, ownedBy string) Card {
	return Card{ID: m.ID, Object: "model", Created: created.Unix(), OwnedBy: ownedBy, Root: m.Root, Parent: m.Parent}
}
