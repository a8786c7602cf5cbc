package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Holding the engine. A reinforcement-learning trainer stops the engines
// while it gives them new weights and frees their memory while it trains:
// SGLang's /pause_generation until /continue_generation,
// /release_memory_occupation until /resume_memory_occupation, and
// /update_weights_from_disk; vLLM's, in its development mode, /pause
// until /resume and /sleep until /wake_up, with /is_paused, /is_sleeping
// and /reset_prefix_cache. Held, the engine takes no new request: one
// waits at its door until it is let go (a sleeping vLLM answers 503, as
// vLLM does), and the requests it has stop where they are, the model's
// clock standing still, unless the hold's mode aborted them (the default
// of both engines' pauses and of vLLM's sleep) or waited for them to end
// (mode "wait"). A request that waited is timed from when it entered the
// engine, and the pause is not counted in the latencies of those held in
// place (the model's time stood still).

// holds is what holds the engine.
type holds struct {
	mu     sync.Mutex
	paused bool            // a pause: SGLang's /pause_generation, vLLM's /pause
	asleep map[string]bool // the memory released (SGLang's tags) or asleep (vLLM's)
	// draining counts the holds under way that wait for the engine's
	// requests to end (mode "wait", new weights): new requests wait.
	draining int
	// door is closed (and dropped) when the engine is let go; nil while
	// nothing holds it.
	door chan struct{}
}

// errAsleep is why a request is refused: the engine sleeps (vLLM).
var errAsleep = errors.New("the model is sleeping: POST /wake_up wakes it")

// sleepTags are vLLM's memory, which /sleep frees and /wake_up brings back
// (all of it, or the tags named); memoryTags SGLang's, which
// /release_memory_occupation frees and /resume_memory_occupation brings
// back.
var (
	sleepTags  = []string{"weights", "kv_cache"}
	memoryTags = []string{"weights", "kv_cache", "cuda_graph"}
)

// enter waits until the engine takes new requests, or ctx ends; a
// sleeping vLLM refuses at once (errAsleep).
func (s *Server) enter(ctx context.Context) error {
	for {
		s.holds.mu.Lock()
		door := s.holds.door
		asleep := s.cfg.MetricsFormat == "vllm" && len(s.holds.asleep) > 0
		s.holds.mu.Unlock()
		switch {
		case asleep:
			return errAsleep
		case door == nil:
			return nil
		}
		select {
		case <-door:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// hold changes what holds the engine, under its lock, then stops or
// starts the model's clock and closes or opens the door to match.
func (s *Server) hold(change func(h *holds)) {
	h := &s.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	change(h)
	stopped := h.paused || len(h.asleep) > 0
	now := time.Now()
	s.drv.mu.Lock()
	if stopped {
		s.clk.freeze(now)
	} else {
		s.clk.thaw(now)
	}
	s.drv.mu.Unlock()
	s.drv.wake()
	switch shut := stopped || h.draining > 0; {
	case shut && h.door == nil:
		h.door = make(chan struct{})
	case !shut && h.door != nil:
		close(h.door)
		h.door = nil
	}
}

// abortAll ends every request the engine has, as an abort of all does,
// and waits (a little) for them to leave it.
func (s *Server) abortAll(ctx context.Context) {
	s.aborts.abort("", true)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = s.drv.awaitIdle(ctx)
}

// drain waits, new requests held at the door, for the engine's requests
// to end; then, unless ctx ended first, apply holds the engine.
func (s *Server) drain(ctx context.Context, apply func(h *holds)) error {
	s.hold(func(h *holds) { h.draining++ })
	err := s.drv.awaitIdle(ctx)
	s.hold(func(h *holds) {
		h.draining--
		if err == nil {
			apply(h)
		}
	})
	return err
}

// stop holds the engine in a pause's mode: "abort" ends what it has,
// "wait" waits for it to end, any other keeps it in place. A nil error
// means it is held.
func (s *Server) stop(ctx context.Context, mode string, apply func(h *holds)) error {
	switch mode {
	case "wait":
		return s.drain(ctx, apply)
	case "abort":
		s.hold(apply) // first, so that nothing new slips in
		s.abortAll(ctx)
	default:
		s.hold(apply)
	}
	return nil
}

// readMode reads a pause's mode from SGLang's JSON body ({"mode": ...};
// none or empty: "abort"), refusing one not in modes.
func readMode(r *http.Request, modes ...string) (string, error) {
	var req struct {
		Mode string `json:"mode"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil && len(strings.TrimSpace(string(body))) > 0 {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		return "", errors.New("the body must be a JSON object")
	}
	return checkMode(req.Mode, modes)
}

// checkMode is mode, "abort" if empty, if one of modes.
func checkMode(mode string, modes []string) (string, error) {
	if mode == "" {
		mode = "abort"
	}
	if !slices.Contains(modes, mode) {
		return "", errors.New("mode must be one of " + strings.Join(modes, ", ") + ", got " + strconv.Quote(mode))
	}
	return mode, nil
}

// checkTags is the memory tags named, all of known if none, refusing one
// not in known.
func checkTags(tags, known []string) ([]string, error) {
	if len(tags) == 0 {
		return known, nil
	}
	for _, t := range tags {
		if !slices.Contains(known, t) {
			return nil, fmt.Errorf("unknown memory tag %q (want %s)", t, strings.Join(known, ", "))
		}
	}
	return tags, nil
}

// writeJSON answers v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// pauseGeneration is SGLang's /pause_generation: {"mode": "abort"} (the
// default) aborts what the engine has, "retract" and "in_place" keep it
// (the emulator keeps a retracted request in place: it does not free and
// recompute its cache).
func (s *Server) pauseGeneration(w http.ResponseWriter, r *http.Request) {
	mode, err := readMode(r, "abort", "retract", "in_place")
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	_ = s.stop(r.Context(), mode, func(h *holds) { h.paused = true })
	writeJSON(w, http.StatusOK, map[string]string{"message": "Generation paused successfully.", "status": "ok"})
}

// continueGeneration is SGLang's /continue_generation.
func (s *Server) continueGeneration(w http.ResponseWriter, r *http.Request) {
	s.hold(func(h *holds) { h.paused = false })
	writeJSON(w, http.StatusOK, map[string]string{"message": "Generation continued successfully.", "status": "ok"})
}

// memory is SGLang's /release_memory_occupation (release true) and
// /resume_memory_occupation: {"tags": [...]}, all of its memory if none.
// Released, the engine holds its requests in place; its KV cache released,
// its prefix cache is emptied.
func (s *Server) memory(release bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Tags []string `json:"tags"`
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil && len(strings.TrimSpace(string(body))) > 0 {
			err = json.Unmarshal(body, &req)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "BadRequestError", "the body must be {\"tags\": [...]}")
			return
		}
		tags, err := checkTags(req.Tags, memoryTags)
		if err != nil {
			writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
			return
		}
		s.setAsleep(tags, release)
		if release && slices.Contains(tags, "kv_cache") {
			s.drv.flush()
		}
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": ""})
	}
}

// setAsleep marks tags asleep (or awake).
func (s *Server) setAsleep(tags []string, asleep bool) {
	s.hold(func(h *holds) {
		if h.asleep == nil {
			h.asleep = map[string]bool{}
		}
		for _, t := range tags {
			if asleep {
				h.asleep[t] = true
			} else {
				delete(h.asleep, t)
			}
		}
	})
}

// updateWeightsFromDisk is SGLang's /update_weights_from_disk:
// {"model_path": ..., "abort_all_requests": false, "flush_cache": true}.
// It waits for the engine's requests to end (new ones held), or aborts
// them, then takes the weights (at once) and empties its prefix cache.
func (s *Server) updateWeightsFromDisk(w http.ResponseWriter, r *http.Request) {
	req := struct {
		ModelPath string `json:"model_path"`
		AbortAll  bool   `json:"abort_all_requests"`
		Flush     *bool  `json:"flush_cache"`
	}{}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.ModelPath == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "message": "the body must name a model_path"})
		return
	}
	// Held while the weights load, let go after, unless it was paused:
	// then its requests kept in place stay (they are not waited for).
	s.holds.mu.Lock()
	paused := s.holds.paused
	s.holds.mu.Unlock()
	switch {
	case req.AbortAll:
		_ = s.stop(r.Context(), "abort", func(h *holds) { h.paused = true })
	case !paused:
		if s.drain(r.Context(), func(h *holds) { h.paused = true }) != nil {
			return // the client went away
		}
	}
	if req.Flush == nil || *req.Flush {
		s.drv.flush()
	}
	if !paused {
		s.hold(func(h *holds) { h.paused = false })
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}

// vllmMode reads vLLM's /pause's and /sleep's mode from the query:
// "abort" (the default), "wait" or "keep"; the deprecated
// wait_for_inflight_requests, true, makes it "wait" whatever the mode.
func vllmMode(q url.Values) (string, error) {
	mode := q.Get("mode")
	if v := q.Get("wait_for_inflight_requests"); v != "" {
		wait, ok := parseBool(v)
		if !ok {
			return "", fmt.Errorf("wait_for_inflight_requests must be a boolean, got %q", v)
		}
		if wait {
			mode = "wait"
		}
	}
	return checkMode(mode, []string{"abort", "wait", "keep"})
}

// parseBool reads a query's boolean as FastAPI does; ok is false for a
// value that is not one.
func parseBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes", "t", "y":
		return true, true
	case "0", "false", "off", "no", "f", "n":
		return false, true
	}
	return false, false
}

// pause is vLLM's /pause?mode=abort|wait|keep&clear_cache=true: held, the
// engine's prefix cache emptied unless clear_cache=false or in mode
// "keep".
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode, err := vllmMode(q)
	clear := mode != "keep"
	if c := q.Get("clear_cache"); c != "" && err == nil {
		v, ok := parseBool(c)
		if !ok {
			err = fmt.Errorf("clear_cache must be a boolean, got %q", c)
		}
		clear = clear && v
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if s.stop(r.Context(), mode, func(h *holds) { h.paused = true }) != nil {
		return
	}
	if clear {
		s.drv.flush()
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "paused"})
}

// resume is vLLM's /resume.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	s.hold(func(h *holds) { h.paused = false })
	writeJSON(w, http.StatusOK, map[string]string{"status": "resumed"})
}

// isPaused is vLLM's /is_paused.
func (s *Server) isPaused(w http.ResponseWriter, r *http.Request) {
	s.holds.mu.Lock()
	paused := s.holds.paused
	s.holds.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"is_paused": paused})
}

// sleep is vLLM's /sleep?level=1|2&mode=abort|wait|keep: its weights and
// KV cache asleep, its prefix cache emptied (when it holds no request).
func (s *Server) sleep(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode, err := vllmMode(q)
	if l := q.Get("level"); err == nil && l != "" && l != "1" && l != "2" {
		err = errors.New("level must be 1 or 2, got " + strconv.Quote(l))
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	asleep := func(h *holds) {
		if h.asleep == nil {
			h.asleep = map[string]bool{}
		}
		for _, t := range sleepTags {
			h.asleep[t] = true
		}
	}
	if s.stop(r.Context(), mode, asleep) != nil {
		return
	}
	s.drv.flush()
	w.WriteHeader(http.StatusOK)
}

// wakeUp is vLLM's /wake_up[?tags=weights&tags=kv_cache]: all of its
// memory, or the tags named.
func (s *Server) wakeUp(w http.ResponseWriter, r *http.Request) {
	tags, err := checkTags(r.URL.Query()["tags"], sleepTags)
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	s.setAsleep(tags, false)
	w.WriteHeader(http.StatusOK)
}

// isSleeping is vLLM's /is_sleeping: asleep while any of its memory is.
func (s *Server) isSleeping(w http.ResponseWriter, r *http.Request) {
	s.holds.mu.Lock()
	asleep := len(s.holds.asleep) > 0
	s.holds.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": asleep})
}

// resetPrefixCache is vLLM's /reset_prefix_cache: the prefix cache
// emptied if no request holds blocks of it (vLLM then logs a warning and
// answers 200 all the same).
func (s *Server) resetPrefixCache(w http.ResponseWriter, r *http.Request) {
	s.drv.flush()
	w.WriteHeader(http.StatusOK)
}
