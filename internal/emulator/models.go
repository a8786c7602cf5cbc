package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// Models: the base model is served under one or more names (vLLM's
// --served-model-name a b; the first is the primary name), and LoRA
// adapters run on it, given at start (--lora-modules) or loaded and
// unloaded at runtime (vLLM's POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter). A request names any served name (or none) for
// the base model, an adapter's name or SGLang's BASE:ADAPTER for an
// adapter; the engine runs it with the adapter (Request.Adapter, the
// adapter's prefix.ModelKey) and its prompt's blocks keyed by it, as
// engines key their prefix caches by adapter.

// Limits on the names a replica serves, a client's loads included: as many
// as a router keeps of one replica (models.MaxPerReplica and MaxNameBytes).
const (
	maxModelNames = 1024
	maxNameBytes  = 256
)

// adapter is one LoRA adapter on the base model.
type adapter struct {
	name, root string
	key        uint64 // prefix.ModelKey(name): the engine's Request.Adapter
}

// catalog is what the replica serves; immutable once published (the
// server swaps it whole on a load or unload).
type catalog struct {
	served   []string // the base model's names, the primary first
	isServed map[string]bool
	adapters []adapter // in the order they were loaded
	byName   map[string]int
	byKey    map[uint64]string
}

func newCatalog(served []string, adapters []adapter) *catalog {
	c := &catalog{served: served, isServed: make(map[string]bool, len(served)), adapters: adapters,
		byName: make(map[string]int, len(adapters)), byKey: make(map[uint64]string, len(adapters))}
	for _, n := range served {
		c.isServed[n] = true
	}
	for i, a := range adapters {
		c.byName[a.name] = i
		c.byKey[a.key] = a.name
	}
	return c
}

// lookup returns the adapter a request's model names (nil for the base
// model), and whether the replica serves the model at all.
func (c *catalog) lookup(model string) (*adapter, bool) {
	if model == "" || c.isServed[model] {
		return nil, true
	}
	if i, ok := c.byName[model]; ok {
		return &c.adapters[i], true
	}
	if i := strings.LastIndexByte(model, ':'); i > 0 && c.isServed[model[:i]] {
		if j, ok := c.byName[model[i+1:]]; ok {
			return &c.adapters[j], true
		}
	}
	return nil, false
}

// checkAdapterName says why a name cannot be an adapter's: empty, too
// long, a comma (vLLM's metrics join adapter names with commas) or white
// space, or a character JSON would escape (the model list stays within
// what a router reads of it: 1,024 names of 256 bytes and paths as long).
func checkAdapterName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("an adapter has no name")
	case len(name) > maxNameBytes:
		return fmt.Errorf("an adapter name of %d bytes, longer than %d", len(name), maxNameBytes)
	case strings.ContainsAny(name, ", \t\r\n"):
		return fmt.Errorf("adapter name %q holds a comma or white space", name)
	case !plain(name):
		return fmt.Errorf("adapter name %q holds a character other than printable ASCII, or one of \" \\ < > &", name)
	}
	return nil
}

// plain reports whether s is printable ASCII without the characters JSON
// escapes (" \ < > &).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || strings.IndexByte(`"\<>&`, c) >= 0 {
			return false
		}
	}
	return true
}

// buildCatalog checks and applies the config's names: Model (default the
// first served name, else "gorgo-emulated") is the primary name, served
// first; LoRAModules are NAME or NAME=PATH.
func buildCatalog(cfg *Config) (*catalog, error) {
	if cfg.Model == "" {
		cfg.Model = "gorgo-emulated"
		if len(cfg.ServedNames) > 0 {
			cfg.Model = cfg.ServedNames[0]
		}
	}
	served := []string{cfg.Model}
	listed := map[string]bool{}
	for _, n := range cfg.ServedNames {
		switch {
		case n == "":
			return nil, fmt.Errorf("a served model name is empty")
		case listed[n]:
			return nil, fmt.Errorf("served model name %q given twice", n)
		case n != cfg.Model:
			served = append(served, n)
		}
		listed[n] = true
	}
	seen := map[string]bool{}
	for _, n := range served {
		seen[n] = true
	}
	var adapters []adapter
	for _, m := range cfg.LoRAModules {
		name, root, hasPath := strings.Cut(m, "=")
		if !hasPath {
			root = "/adapters/" + name
		}
		if err := checkAdapterName(name); err != nil {
			return nil, fmt.Errorf("LoRA module %q: %v", m, err)
		}
		if hasPath && (root == "" || len(root) > maxNameBytes || !plain(root)) {
			return nil, fmt.Errorf("LoRA module %q: the path must be 1 to %d bytes of printable ASCII without \" \\ < > &", m, maxNameBytes)
		}
		if seen[name] {
			return nil, fmt.Errorf("LoRA module %q: the name is already served", name)
		}
		seen[name] = true
		adapters = append(adapters, adapter{name: name, root: root, key: prefix.ModelKey(name)})
	}
	for _, n := range served {
		if len(n) > maxNameBytes {
			return nil, fmt.Errorf("a served model name of %d bytes, longer than %d", len(n), maxNameBytes)
		}
	}
	if n := len(served) + len(adapters); n > maxModelNames {
		return nil, fmt.Errorf("%d served names and adapters, more than %d", n, maxModelNames)
	}
	return newCatalog(served, adapters), nil
}

// Models returns what the replica serves now: the base model's names, the
// primary one first, and the adapters' names, in the order they were
// loaded.
func (s *Server) Models() (served, adapters []string) {
	c := s.models.Load()
	adapters = make([]string, len(c.adapters))
	for i, a := range c.adapters {
		adapters[i] = a.name
	}
	return slices.Clone(c.served), adapters
}

// modelCard is an entry of GET /v1/models, in vLLM's shape.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// listModels answers GET /v1/models: every served name (its root the
// primary name, as vLLM's is the model path), then every adapter (its
// root the adapter's path, its parent the primary name).
func (s *Server) listModels(w http.ResponseWriter, _ *http.Request) {
	c := s.models.Load()
	now := time.Now().Unix()
	owner := s.cfg.MetricsFormat // "vllm" or "sglang", as each engine says
	primary := s.cfg.Model
	data := make([]modelCard, 0, len(c.served)+len(c.adapters))
	for _, n := range c.served {
		data = append(data, modelCard{ID: n, Object: "model", Created: now, OwnedBy: owner, Root: primary, MaxModelLen: s.prof.MaxContextTokens})
	}
	for _, a := range c.adapters {
		data = append(data, modelCard{ID: a.name, Object: "model", Created: now, OwnedBy: owner, Root: a.root, Parent: &primary, MaxModelLen: s.prof.MaxContextTokens})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", data})
}

// maxAdminBody bounds the body of a load or unload request.
const maxAdminBody = 64 << 10

// loraRequest is the body of vLLM's load and unload requests.
type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

func readLoRARequest(w http.ResponseWriter, r *http.Request) (loraRequest, bool) {
	var lr loraRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err == nil {
		err = json.Unmarshal(body, &lr)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "reading the request: %v", err)
		return lr, false
	}
	return lr, true
}

func writeSuccess(w http.ResponseWriter, format string, args ...any) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, format, args...)
}

// adapterOutcome is what a load or unload of an adapter came to: a
// status (200: done), an error type and a message.
type adapterOutcome struct {
	status    int
	typ, text string
}

// addAdapter serves the adapter lr names (listed and routed) from now on.
func (s *Server) addAdapter(lr loraRequest) adapterOutcome {
	refuse := func(format string, args ...any) adapterOutcome {
		return adapterOutcome{http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf(format, args...)}
	}
	if lr.Name == "" || lr.Path == "" {
		return refuse("Both 'lora_name' and 'lora_path' must be provided.")
	}
	if err := checkAdapterName(lr.Name); err != nil {
		return refuse("%v", err)
	}
	if len(lr.Path) > maxNameBytes || !plain(lr.Path) {
		return refuse("a LoRA path must be at most %d bytes of printable ASCII without \" \\ < > &", maxNameBytes)
	}
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	c := s.models.Load()
	_, loaded := c.byName[lr.Name]
	switch {
	case loaded:
		return refuse("The lora adapter '%s' has already been loaded.", lr.Name)
	case c.isServed[lr.Name]:
		return refuse("The name '%s' is a served model's, not an adapter's.", lr.Name)
	case len(c.served)+len(c.adapters) >= maxModelNames:
		return refuse("Cannot load '%s': this server serves %d names, its limit.", lr.Name, maxModelNames)
	}
	adapters := make([]adapter, len(c.adapters), len(c.adapters)+1)
	copy(adapters, c.adapters)
	adapters = append(adapters, adapter{name: lr.Name, root: lr.Path, key: prefix.ModelKey(lr.Name)})
	s.models.Store(newCatalog(c.served, adapters))
	s.lora.Store(true)
	return adapterOutcome{http.StatusOK, "", fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", lr.Name)}
}

// removeAdapter stops serving the adapter lr names (requests in flight on
// it finish).
func (s *Server) removeAdapter(lr loraRequest) adapterOutcome {
	if lr.Name == "" {
		return adapterOutcome{http.StatusBadRequest, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter."}
	}
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	c := s.models.Load()
	i, ok := c.byName[lr.Name]
	if !ok {
		return adapterOutcome{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", lr.Name)}
	}
	adapters := make([]adapter, 0, len(c.adapters)-1)
	adapters = append(append(adapters, c.adapters[:i]...), c.adapters[i+1:]...)
	s.models.Store(newCatalog(c.served, adapters))
	return adapterOutcome{http.StatusOK, "", fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", lr.Name)}
}

// loadAdapter is vLLM's POST /v1/load_lora_adapter, unloadAdapter its
// /v1/unload_lora_adapter: a plain-text success, else an error in
// OpenAI's shape.
func (s *Server) loadAdapter(w http.ResponseWriter, r *http.Request) {
	s.vllmAdapter(w, r, s.addAdapter)
}

func (s *Server) unloadAdapter(w http.ResponseWriter, r *http.Request) {
	s.vllmAdapter(w, r, s.removeAdapter)
}

func (s *Server) vllmAdapter(w http.ResponseWriter, r *http.Request, do func(loraRequest) adapterOutcome) {
	lr, ok := readLoRARequest(w, r)
	if !ok {
		return
	}
	if o := do(lr); o.status != http.StatusOK {
		writeError(w, o.status, o.typ, "%s", o.text)
	} else {
		writeSuccess(w, "%s", o.text)
	}
}

// sglangAdapter is SGLang's POST /load_lora_adapter or
// /unload_lora_adapter: {"success": ..., "error_message": ...,
// "loaded_adapters": {name: path}}, a 200 or a 400.
func (s *Server) sglangAdapter(do func(loraRequest) adapterOutcome) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		lr, ok := readLoRARequest(w, r)
		if !ok {
			return
		}
		o := do(lr)
		loaded := map[string]string{}
		for _, a := range s.models.Load().adapters {
			loaded[a.name] = a.root
		}
		answer := map[string]any{"success": o.status == http.StatusOK, "error_message": nil, "loaded_adapters": loaded}
		status := http.StatusOK
		if o.status != http.StatusOK {
			answer["error_message"], status = o.text, http.StatusBadRequest
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(answer)
	}
}

// adapterNames turns the engine's adapter ids into names, sorted; an id no
// longer served (unloaded with requests in flight) is left out.
func (c *catalog) adapterNames(ids []uint64) []string {
	names := make([]string, 0, len(ids))
	for _, id := range ids {
		if n, ok := c.byKey[id]; ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}
