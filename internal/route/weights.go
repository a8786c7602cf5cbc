package route

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Weights scale the RTT and queue terms of a cost (the prefill weight is 1).
type Weights struct {
	RTT   float64 `json:"rtt"`
	Queue float64 `json:"queue"`
}

// Validate reports weights that are negative or not finite.
func (w Weights) Validate() error {
	for _, v := range []float64{w.RTT, w.Queue} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("weights must be finite and non-negative, got rtt=%v queue=%v", w.RTT, w.Queue)
		}
	}
	return nil
}

// String formats weights (to 4 significant digits) as ParseWeights reads them.
func (w Weights) String() string {
	return "rtt=" + strconv.FormatFloat(w.RTT, 'g', 4, 64) + ",queue=" + strconv.FormatFloat(w.Queue, 'g', 4, 64)
}

// ParseWeights reads "rtt=X,queue=Y" (either may be omitted and then keeps
// its value in base) or, if s names a file, a JSON object {"rtt":X,"queue":Y}
// whose unknown fields are errors.
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
		default:
			return w, fmt.Errorf("weights: unknown weight %q (valid: rtt, queue)", k)
		}
	}
	return w, w.Validate()
}
