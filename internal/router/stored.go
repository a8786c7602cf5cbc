package router

import "sync"

// Stored responses. An engine that serves the Responses API with its store
// on (vLLM's in memory, SGLang's) keeps each response it answers, under
// the response's id, for a follow-up that names it (previous_response_id)
// and for GET /v1/responses/{id} and its cancel: each replica holds its
// own, so that such a request sent to another is answered "not found". The
// router remembers which replica answered each of the last maxStored
// responses (a mesh's routers tell each other), and front ends send those
// requests there.

// maxStored is how many responses' replicas are remembered: the most
// recently answered or asked for. maxStoredID bounds an id's length: a
// longer one (an engine's ids are "resp_" and 32 hex digits) is not kept.
const (
	maxStored   = 1 << 16
	maxStoredID = 256
)

// storedResponses maps a response's id to the replica that stored it, in
// two generations: when the current one is full it becomes the old one,
// and the old one is dropped; an id found in the old one moves to the
// current one. So it holds at most maxStored ids, and an id asked for
// stays.
type storedResponses struct {
	mu       sync.Mutex
	cur, old map[string]string
}

// Stored records that replica answered the response id (and stored it, if
// its store is on). An id too long, or a replica the router does not have,
// is not recorded.
func (r *Router) Stored(id, replica string) {
	if id == "" || len(id) > maxStoredID {
		return
	}
	m, err := r.member(replica)
	if err != nil {
		return
	}
	s := &r.stored
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put(id, m.id) // the router's own string: the caller's may be a larger buffer's
}

func (s *storedResponses) put(id, replica string) {
	if s.cur == nil {
		s.cur = make(map[string]string)
	}
	if len(s.cur) >= maxStored/2 {
		s.old, s.cur = s.cur, make(map[string]string, maxStored/2)
	}
	s.cur[id] = replica
	delete(s.old, id)
}

// StoredAt returns the replica that stored the response id, if the router
// knows it and has it, whether or not it takes new requests: a draining
// replica still holds its store, and answers a GET of it.
func (r *Router) StoredAt(id string) (string, bool) {
	m, ok := r.storedAt(id)
	if !ok {
		return "", false
	}
	return m.id, true
}

// Holder returns the replica that stored the response id, if the router
// knows it and the replica may take the follow-up now (available, or
// draining: draining stops new conversations, not those it holds; a
// follow-up names it as policy.Request.Holder); else false (the request
// goes where the policy sends it: a replica whose store is shared holds
// it too, and one that does not answers "not found").
func (r *Router) Holder(id string) (string, bool) {
	m, ok := r.storedAt(id)
	if !ok || !m.holds() {
		return "", false
	}
	return m.id, true
}

// storedAt finds the replica that stored the response id (an id found in
// the old generation moves to the current one).
func (r *Router) storedAt(id string) (*member, bool) {
	s := &r.stored
	s.mu.Lock()
	replica, ok := s.cur[id]
	if !ok {
		if replica, ok = s.old[id]; ok {
			s.put(id, replica)
		}
	}
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	m, err := r.member(replica)
	return m, err == nil
}
