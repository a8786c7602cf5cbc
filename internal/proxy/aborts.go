package proxy

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/lifecycle"
)

// Client aborts. An engine ends a request a client aborted (SGLang's
// /abort_request, by its rid or all of them) with finish_reason "abort",
// which before its first token is also how an engine gives up a request
// it cannot serve, and such a request the router tries on another
// replica. A request its client aborted is not to be served elsewhere:
// the router remembers the aborts it passed on, and relays the abort of a
// request they name.

// Bounds on what is remembered: an abort covers the requests it came
// after for a minute; at most 4,096 rids are kept, each of at most 256
// bytes (past that, the older than a minute go, else a quarter of the
// others).
const (
	abortMemory    = time.Minute
	maxAbortedRIDs = 4096
	maxRIDBytes    = 256
)

// aborts is what clients aborted through the router.
type aborts struct {
	mu   sync.Mutex
	all  time.Time            // the last abort of all requests
	rids map[string]time.Time // the rids aborted, and when
}

// note records an /abort_request's body, received at.
func (a *aborts) note(body []byte, at time.Time) {
	var req struct {
		RID      json.RawMessage `json:"rid"`
		AbortAll bool            `json:"abort_all"`
	}
	if json.Unmarshal(body, &req) != nil {
		return
	}
	var rids []string
	if json.Unmarshal(req.RID, &rids) != nil {
		var rid string
		if json.Unmarshal(req.RID, &rid) == nil && rid != "" {
			rids = []string{rid}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if req.AbortAll {
		a.all = at
	}
	for _, rid := range rids {
		if rid == "" || len(rid) > maxRIDBytes {
			continue
		}
		if a.rids == nil {
			a.rids = make(map[string]time.Time)
		}
		if len(a.rids) >= maxAbortedRIDs {
			a.forget(at)
		}
		a.rids[rid] = at
	}
}

// forget drops the rids aborted over abortMemory before now, or, if none
// is that old, a quarter of the others (so that a flood of aborts scans
// the set once per thousand of them, not once each).
func (a *aborts) forget(now time.Time) {
	n := len(a.rids)
	for rid, at := range a.rids {
		if now.Sub(at) > abortMemory {
			delete(a.rids, rid)
		}
	}
	for rid := range a.rids {
		if len(a.rids) <= n-n/4 {
			break
		}
		delete(a.rids, rid)
	}
}

// covers reports whether a client aborted req, now: all requests since it
// arrived, or its rid (one of its batch's), within the last abortMemory.
// An aborted rid is a prefix, as SGLang matches it (a batch's prompts
// under one rid run as rid_0, rid_1, ...).
func (a *aborts) covers(req *lifecycle.Request, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.all.IsZero() && !a.all.Before(req.Received) && now.Sub(a.all) <= abortMemory {
		return true
	}
	rid := req.Parsed.RID
	if rid == "" || len(a.rids) == 0 {
		return false
	}
	rids := []string{rid}
	if rid[0] == '[' {
		rids = nil
		_ = json.Unmarshal([]byte(rid), &rids)
	}
	for aborted, at := range a.rids {
		if at.Before(req.Received) || now.Sub(at) > abortMemory {
			continue // before the request, or long ago: not its abort
		}
		for _, r := range rids {
			if strings.HasPrefix(r, aborted) {
				return true
			}
		}
	}
	return false
}
