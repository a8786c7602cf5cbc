package trace

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// ModelWeight is a model and its weight in a mix of models (see
// AssignModels).
type ModelWeight struct {
	Name   string
	Weight float64
}

// ParseModelWeights reads a mix of models, "NAME:W,NAME:W,...": each name
// with a non-negative weight (weights are relative: 1,1 and 50,50 are the
// same mix). A name alone weighs 1. The weight is what follows the last
// colon when that is a number, so SGLang's BASE:ADAPTER names work
// ("base:ad1:2"; "base:ad1" alone weighs 1). Names must be distinct, the
// weights finite and not all zero.
func ParseModelWeights(s string) ([]ModelWeight, error) {
	var out []ModelWeight
	err := parseMix("models", "NAME:WEIGHT", s, func(part string) (string, float64, error) {
		mw := ModelWeight{Name: part, Weight: 1}
		if i := strings.LastIndexByte(part, ':'); i >= 0 {
			if w, err := strconv.ParseFloat(strings.TrimSpace(part[i+1:]), 64); err == nil {
				mw = ModelWeight{Name: strings.TrimSpace(part[:i]), Weight: w}
			}
		}
		switch {
		case mw.Name == "":
			return "", 0, fmt.Errorf("%q has no name", part)
		case strings.ContainsAny(mw.Name, " \t\n"):
			return "", 0, fmt.Errorf("name %q has a space", mw.Name)
		}
		out = append(out, mw)
		return mw.Name, mw.Weight, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parseMix reads a comma-separated mix, "PART,PART,...", each part read by
// one into its name and weight: names distinct, weights finite, not
// negative and not all zero. what names the mix in errors, form its parts.
func parseMix(what, form, s string, one func(part string) (name string, weight float64, err error)) error {
	seen := map[string]bool{}
	n, total := 0, 0.0
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, err := one(part)
		switch {
		case err != nil:
			return fmt.Errorf("%s %q: %w (want %s,...)", what, s, err, form)
		case math.IsNaN(w) || math.IsInf(w, 0) || w < 0:
			return fmt.Errorf("%s %q: %s's weight must be a finite non-negative number, got %v", what, s, name, w)
		case seen[name]:
			return fmt.Errorf("%s %q: %s listed twice", what, s, name)
		}
		seen[name] = true
		total += w
		n++
	}
	return checkMix(what, form, s, n, total)
}

// checkMix says why a mix of n parts whose weights add up to total cannot
// be drawn from.
func checkMix(what, form, s string, n int, total float64) error {
	if n == 0 {
		return fmt.Errorf("%s: none given (want %s,...)", what, form)
	}
	if !(total > 0) || math.IsInf(total, 0) {
		return fmt.Errorf("%s %q: the weights add up to %v, want a positive finite total", what, s, total)
	}
	return nil
}

// FormatModelWeights writes a mix as ParseModelWeights reads it.
func FormatModelWeights(ws []ModelWeight) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = w.Name + ":" + strconv.FormatFloat(w.Weight, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

// AssignModels gives every request of reqs a model drawn from weights, in
// place: a session keeps one model, drawn by the weights with a draw that
// depends only on the seed and the session's name (so the same session
// gets the same model in any window of the trace, and every policy of a
// comparison sees the same mix); a request without a session draws its
// own, by its index. It replaces the models the requests named. weights
// must be valid (see ParseModelWeights); with none, it does nothing.
func AssignModels(reqs []Request, weights []ModelWeight, seed uint64) {
	ws := make([]float64, len(weights))
	for i, w := range weights {
		ws[i] = w.Weight
	}
	drawBySession(reqs, ws, seed, func(r *Request, k int) { r.Model = weights[k].Name })
}

// drawBySession draws an index into weights for every request of reqs and
// hands it to set: one draw per session, depending only on the seed and
// the session's name; a request without a session draws its own, by its
// index. weights are non-negative, not all zero; with none it does
// nothing.
func drawBySession(reqs []Request, weights []float64, seed uint64, set func(*Request, int)) {
	if len(weights) == 0 {
		return
	}
	total := 0.0
	for _, w := range weights {
		total += w
	}
	bySession := map[string]int{}
	var key []byte
	for i := range reqs {
		r := &reqs[i]
		if k, ok := bySession[r.Session]; ok {
			set(r, k)
			continue
		}
		key = strconv.AppendUint(key[:0], seed, 10)
		key = append(key, '/')
		if r.Session != "" {
			key = append(key, r.Session...)
		} else {
			key = append(key, '#')
			key = strconv.AppendInt(key, int64(i), 10)
		}
		// 53 uniform bits from the hash: a draw in [0, total).
		u := float64(xxhash.Sum64(key)>>11) / (1 << 53) * total
		k := len(weights) - 1
		for j, w := range weights {
			if u < w {
				k = j
				break
			}
			u -= w
		}
		// A zero weight is never drawn, even at the end of the range.
		for weights[k] == 0 && k > 0 {
			k--
		}
		set(r, k)
		if r.Session != "" {
			bySession[r.Session] = k
		}
	}
}
