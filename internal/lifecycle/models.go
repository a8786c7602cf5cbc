package lifecycle

import (
	"fmt"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Models. A request names a model (its body's "model"): one of the
// router's aliases, resolved to a served name by its split (Config.Aliases;
// a session keeps its target), or a name a replica serves. The decision
// then sees only the replicas that serve it (policy.Request.Model), and
// the body sent to them names the served name (spliced, when an alias
// stood for it). A name no replica serves is a 404 at once (unless some
// replica's models are unknown: it may serve it); a request that names
// none gets the fleet's only base model, or a 400 when it serves several.
// SGLang names an adapter in a field of its own too (lora_path, on its
// /generate, chat and completions): it is the request's model where some
// replica is known to serve it and the request names no model or the
// adapter's base (the engine reads it there, so the body stays as it is),
// and otherwise left to the engines, as the body's other fields are.

// maxNamesListed bounds the names an error lists.
const maxNamesListed = 20

// resolveModel turns the client's model into the served name the request
// is routed by, and rewrites the body if an alias stood for another name.
// A dry run (dry) changes no alias's split.
func (r *Request) resolveModel(kind Kind, body []byte, dry bool) *wire.Error {
	c := r.core
	name := r.Parsed.Model
	// No replica's name is longer (BASE:ADAPTER is two names), and so
	// long a name is not to be carried into labels, spans or the live view.
	if maxName := 2*models.MaxNameBytes + 1; len(name) > maxName {
		return wire.Errorf(statusBadRequest, "model: a name of %d bytes; no model's is longer than %d", len(name), maxName)
	}
	served, unknown := c.cfg.Router.Catalog()
	if p := r.Parsed.LoRAPath; p != "" {
		// The adapter lora_path names, where it is known, on the base
		// the model names, if it names one.
		if m, known := served.Lookup(p); known && (name == "" || m.IsAdapter() && name == m.Parent) {
			name = p
		}
	}
	target, alias := name, false
	switch {
	case name == "" || c.cfg.Aliases == nil || r.Parsed.Model == "":
	case dry:
		target, alias = c.cfg.Aliases.Peek(name, r.Route.SessionKey)
	default:
		target, alias = c.cfg.Aliases.Resolve(name, r.Route.SessionKey)
	}
	m, known := served.Lookup(target)
	switch {
	case target == "":
		only, bases := c.cfg.Router.DefaultModel()
		switch {
		case bases == 1:
			r.Route.Model = only
		case bases > 1 && kind == Generate:
			// SGLang's /generate has no model field; the router reads one
			// there, or an adapter's lora_path.
			return wire.Errorf(statusBadRequest, `model: required: this router serves several models (%s); a /generate names its own in "model" (the router reads it) or its adapter in "lora_path"`, r.names())
		case bases > 1:
			return wire.Errorf(statusBadRequest, "model: required: this router serves several models (%s)", r.names())
		}
		// No model known: any replica.
	case !known && unknown > 0:
		r.Route.Model = target // a replica whose models are unknown may serve it
	default:
		if !known {
			if alias {
				e := wire.Errorf(statusUnavailable, "no replica serves %s, which the model %s stands for", target, name)
				e.RetryAfter = "5"
				return e
			}
			return wire.ModelNotFound(name)
		}
		// SGLang's BASE:ADAPTER is the adapter's own name to every engine.
		r.Route.Model = target // BASE:ADAPTER stays: each replica's own set checks the base
		target = m.ID
		if m.IsAdapter() { // one key and label for an adapter, named alone or with its base
			r.cacheModel = c.cfg.Router.BaseName(m.Parent) + ":" + m.ID
			r.adapter = true
		}
	}
	if r.cacheModel == "" { // one key and label for a base, under any of its names
		r.cacheModel = c.cfg.Router.BaseName(r.Route.Model)
	}
	switch {
	case known, target == "" && r.Route.Model != "":
		r.modelLabel = r.cacheModel
	case target != "":
		r.modelLabel = otherModel // a name no replica is known to serve: not a label of its own
	}
	if target != name && r.Parsed.Model != "" {
		r.rewriteBuf = prompt.WithModel(body, target, r.rewriteBuf)
		r.rewritten = r.rewriteBuf
	}
	return nil
}

// names lists the fleet's base models and the router's aliases, for an
// error.
func (r *Request) names() string {
	c := r.core
	served, _ := c.cfg.Router.Catalog()
	names := served.Bases()
	if c.cfg.Aliases != nil {
		for _, a := range c.cfg.Aliases.Aliases() {
			names = append(names, a.Name)
		}
	}
	more := ""
	if len(names) > maxNamesListed {
		names, more = names[:maxNamesListed], fmt.Sprintf(" and %d more", len(names)-maxNamesListed)
	}
	return strings.Join(names, ", ") + more
}

// Model is the served name the request is routed by ("" for any replica).
func (r *Request) Model() string { return r.Route.Model }

// Adapter says the request's model is a LoRA adapter some replica is known
// to serve.
func (r *Request) Adapter() bool { return r.adapter }

// Rewritten is the client's body with its model set to the served name an
// alias stood for (nil when the body was not rewritten): what a front end
// that forwards the client's own body (a gateway) must send instead.
func (r *Request) Rewritten() []byte { return r.rewritten }
