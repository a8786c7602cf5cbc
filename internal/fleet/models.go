package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/gorgo-llm/gorgo/internal/models"
)

// Models. A replica whose config does not say what it serves has its GET
// /v1/models read with every probe (before its first probe makes it
// available): a change (an adapter loaded or unloaded, a restart on
// another model) reaches routing within a probe interval. A list that
// cannot be read leaves the last one in place; a replica whose list was
// never read is taken to serve any model. A replica that answers 404 for a
// model it was believed to serve loses it at once (ModelMissing) and its
// list is read again (at most once between two probes); one whose config
// says what it serves gets the config's list back at its next probe.

// ModelMissing records that a replica answered 404 for a model it was
// believed to serve (lifecycle.Health): not a failure of the replica; the
// router stops sending it that model, and the replica's list is read again.
func (f *Fleet) ModelMissing(id, model string) {
	if f.rt.DropModel(id, model) {
		f.log.Warn("replica does not serve a model it was believed to: its list is read again", "replica", id, "model", model)
	}
	// Even when its list was never read: it may be readable now.
	if u := f.Upstream(id); u != nil {
		select {
		case u.refresh <- struct{}{}:
		default:
		}
	}
}

// ModelsChanged reads replica id's model list now, before it returns: a
// client loaded or unloaded an adapter there through the router, and its
// next request may name it.
func (f *Fleet) ModelsChanged(ctx context.Context, id string) {
	if u := f.Upstream(id); u != nil {
		f.refreshModels(ctx, u)
	}
}

// refreshModels reads what a replica serves from its GET /v1/models, or
// takes it from its config, which restores a model the replica once
// answered 404 for. A first failure after successes, and the recovery, are
// logged. It returns the list's round trip (Fleet.timed), ok when the
// replica answered, whatever its answer: a probe's round trip is the
// list's. A replica whose config says what it serves is not asked here
// (its list is only timed, beside its /health: Fleet.probe).
func (f *Fleet) refreshModels(ctx context.Context, u *Upstream) (rtt time.Duration, ok bool) {
	if u.served != nil {
		f.rt.SetModels(u.cfg.ID, u.served)
		return 0, false
	}
	set, rtt, err := f.readModels(ctx, u)
	ok = rtt > 0
	if f.Upstream(u.cfg.ID) != u {
		return rtt, ok // replaced meanwhile
	}
	if err != nil {
		if ctx.Err() == nil && !u.modelsFailing.Swap(true) {
			f.log.Warn("model list not read: the last one stands", "replica", u.cfg.ID, "error", err)
		}
		return rtt, ok
	}
	if u.modelsFailing.Swap(false) {
		f.log.Info("model list read again", "replica", u.cfg.ID)
	}
	if changed, err := f.rt.SetModels(u.cfg.ID, set); err == nil && changed {
		f.log.Info("replica models", "replica", u.cfg.ID, "models", set.String())
	}
	return rtt, ok
}

// maxModelsWait bounds the wait for a model list (a replica's first
// probe waits for it).
const maxModelsWait = 5 * time.Second

// readModels reads a replica's GET /v1/models. rtt is the request's round
// trip (Fleet.timed) when the replica answered (0 when it did not).
func (f *Fleet) readModels(ctx context.Context, u *Upstream) (set *models.Set, rtt time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, min(max(f.Config().ProbeInterval, 2*timeoutFloor), maxModelsWait))
	defer cancel()
	req, err := f.modelsRequest(ctx, u)
	if err != nil {
		return nil, 0, err
	}
	resp, rtt, err := f.timed(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, models.MaxListBytes+1))
	switch {
	case err != nil:
		return nil, rtt, err
	case resp.StatusCode != http.StatusOK:
		return nil, rtt, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	case len(body) > models.MaxListBytes:
		return nil, rtt, fmt.Errorf("GET /v1/models: an answer of more than %d bytes", models.MaxListBytes)
	}
	set, err = models.ParseList(body)
	return set, rtt, err
}

// modelsRequest is a replica's GET /v1/models, with its API key.
func (f *Fleet) modelsRequest(ctx context.Context, u *Upstream) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.cfg.URL+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if u.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+u.apiKey)
	}
	return req, nil
}

// ModelList is what the router serves, as its GET /v1/models answers: every
// name an available replica serves, each once, then the router's aliases.
// ok is false when no available replica's models are known (the list is
// then the replicas' own, as one of them answers it).
func (f *Fleet) ModelList() (list models.List, ok bool) {
	list.Object = "list"
	var sets []*models.Set
	for _, st := range f.rt.Replicas() {
		if st.Available() && st.Models != nil {
			sets = append(sets, st.Models)
		}
	}
	if len(sets) == 0 {
		return list, false
	}
	list.Data = []models.Card{}
	served := models.Union(sets...)
	for _, m := range served.Models() {
		list.Data = append(list.Data, models.NewCard(m, f.start, ownedBy))
	}
	for _, a := range f.aliases.Aliases() {
		if _, ok := served.Lookup(a.Name); !ok { // an alias over a served name is listed once
			list.Data = append(list.Data, models.NewCard(models.Model{ID: a.Name}, f.start, ownedBy))
		}
	}
	return list, true
}

// ownedBy is the owner the router's model list gives every model.
const ownedBy = "gorgo"
