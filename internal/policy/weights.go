package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Weights scale the RTT and queue terms of a cost (the prefill weight is 1)
// and, for gorgo-e2e, its decode terms: Decode the stall a request's
// prefill imposes on the requests decoding, ITL its own decode time.
type Weights struct {
	RTT    float64 `json:"rtt"`
	Queue  float64 `json:"queue"`
	Decode float64 `json:"decode,omitempty"`
	ITL    float64 `json:"itl,omitempty"`
}

// Validate reports weights that are negative or not finite.
func (w Weights) Validate() error {
	for _, v := range []float64{w.RTT, w.Queue, w.Decode, w.ITL} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("weights must be finite and non-negative, got %s", w)
		}
	}
	return nil
}

// String formats weights (to 4 significant digits) as ParseWeights reads
// them; zero decode and itl weights are left out.
func (w Weights) String() string {
	s := "rtt=" + strconv.FormatFloat(w.RTT, 'g', 4, 64) + ",queue=" + strconv.FormatFloat(w.Queue, 'g', 4, 64)
	if w.Decode != 0 || w.ITL != 0 {
		s += ",decode=" + strconv.FormatFloat(w.Decode, 'g', 4, 64) + ",itl=" + strconv.FormatFloat(w.ITL, 'g', 4, 64)
	}
	return s
}

// ParseWeights reads "rtt=X,queue=Y,decode=Z,itl=V" (any may be omitted
// and then keeps its value in base) or, if s names a file, a JSON object
// {"rtt":X,"queue":Y,"decode":Z,"itl":V} whose unknown fields are errors.
func ParseWeights(s string, base Weights) (Weights, error) {
	w := base
	if !strings.Contains(s, "=") {
		data, err := os.ReadFile(s)
		if err != nil {
			return w, fmt.Errorf("weights: want rtt=X,queue=Y or a JSON file: %w", err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&w); err != nil {
			return w, fmt.Errorf("weights file %s: %w", s, err)
		}
		return w, w.Validate()
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if !ok || err != nil {
			return w, fmt.Errorf("weights: bad term %q (want rtt=X,queue=Y)", part)
		}
		switch strings.TrimSpace(k) {
		case "rtt":
			w.RTT = f
		case "queue":
			w.Queue = f
		case "decode":
			w.Decode = f
		case "itl":
			w.ITL = f
		default:
			return w, fmt.Errorf("weights: unknown weight %q (valid: rtt, queue, decode, itl)", k)
		}
	}
	return w, w.Validate()
}

// Tunable reports whether the named policy (or alias) has weights: gorgo,
// gorgo-ms and gorgo-e2e.
func Tunable(name string) bool {
	switch Canonical(name) {
	case "gorgo", "gorgo-ms", DefaultName:
		return true
	}
	return false
}

// WeightsOf returns the weights the named policy takes from o, its
// defaults where o has none (zero for a policy without weights).
func WeightsOf(name string, o Options) Weights {
	switch Canonical(name) {
	case "gorgo":
		if o.Weights == (Weights{}) {
			return PaperWeights
		}
		return o.Weights
	case "gorgo-ms":
		if o.MSWeights == (Weights{}) {
			return Weights{RTT: 1, Queue: 1}
		}
		return o.MSWeights
	case DefaultName:
		if o.E2EWeights == (Weights{}) {
			return DefaultE2EWeights
		}
		return o.E2EWeights
	}
	return Weights{}
}

// WithWeights returns o with the named policy's weights set to w.
func WithWeights(name string, o Options, w Weights) Options {
	switch Canonical(name) {
	case "gorgo":
		o.Weights = w
	case "gorgo-ms":
		o.MSWeights = w
	case DefaultName:
		o.E2EWeights = w
	}
	return o
}
