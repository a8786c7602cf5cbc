package trace

import (
	"math"
	"reflect"
	"testing"
	"time"
)

func TestParseWindow(t *testing.T) {
	tests := []struct {
		in   string
		want Window
	}{
		{"", Window{}},
		{"0s,30m", Window{0, 30 * time.Minute}},
		{"500s,500s", Window{500 * time.Second, 500 * time.Second}},
		{" 1h , 0s ", Window{time.Hour, 0}},
		{"1m30s,1.5s", Window{90 * time.Second, 1500 * time.Millisecond}},
	}
	for _, tt := range tests {
		got, err := ParseWindow(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseWindow(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if tt.in != "" {
			back, err := ParseWindow(got.String())
			if err != nil || back != got {
				t.Errorf("ParseWindow(%q.String()=%q) = %+v, %v", tt.in, got.String(), back, err)
			}
		}
	}
}

func TestParseWindowErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"30m", `window "30m": want START,DURATION as Go durations, e.g. 0s,30m`},
		{"0,30", `window "0,30": duration: time: missing unit in duration "30"`},
		{"x,30m", `window "x,30m": start: time: invalid duration "x"`},
		{"0s,30m,1s", `window "0s,30m,1s": duration: time: unknown unit "m," in duration "30m,1s"`},
		{"-1s,30m", `window "-1s,30m": start must be non-negative`},
		{"0s,-30m", `window "0s,-30m": duration must be non-negative (0 = to the end)`},
	}
	for _, tt := range tests {
		_, err := ParseWindow(tt.in)
		if err == nil || err.Error() != tt.want {
			t.Errorf("ParseWindow(%q) error = %v\nwant %s", tt.in, err, tt.want)
		}
	}
}

func TestApply(t *testing.T) {
	reqs := make([]Request, 6)
	for i := range reqs {
		reqs[i] = Request{Time: time.Duration(i) * 10 * time.Second, Session: "s", InputTokens: 1, HashIDs: []uint64{uint64(i)}}
	}
	times := func(rs []Request) []time.Duration {
		var ts []time.Duration
		for _, r := range rs {
			ts = append(ts, r.Time)
		}
		return ts
	}
	tests := []struct {
		name  string
		w     Window
		scale float64
		want  []time.Duration
		ids   []uint64
	}{
		{"all", Window{}, 1, []time.Duration{0, 10e9, 20e9, 30e9, 40e9, 50e9}, []uint64{0, 1, 2, 3, 4, 5}},
		{"middle", Window{15 * time.Second, 20 * time.Second}, 1, []time.Duration{5e9, 15e9}, []uint64{2, 3}},
		{"end exclusive", Window{10 * time.Second, 20 * time.Second}, 1, []time.Duration{0, 10e9}, []uint64{1, 2}},
		{"to the end", Window{40 * time.Second, 0}, 1, []time.Duration{0, 10e9}, []uint64{4, 5}},
		{"half rate", Window{10 * time.Second, 20 * time.Second}, 2, []time.Duration{0, 20e9}, []uint64{1, 2}},
		{"faster", Window{}, 0.25, []time.Duration{0, 2.5e9, 5e9, 7.5e9, 10e9, 12.5e9}, []uint64{0, 1, 2, 3, 4, 5}},
		{"empty", Window{time.Hour, time.Minute}, 1, nil, nil},
	}
	for _, tt := range tests {
		got := Apply(reqs, tt.w, tt.scale)
		if !reflect.DeepEqual(times(got), tt.want) {
			t.Errorf("%s: times %v, want %v", tt.name, times(got), tt.want)
		}
		var ids []uint64
		for _, r := range got {
			ids = append(ids, r.HashIDs[0])
		}
		if !reflect.DeepEqual(ids, tt.ids) {
			t.Errorf("%s: kept %v, want %v", tt.name, ids, tt.ids)
		}
	}
	if reqs[1].Time != 10*time.Second {
		t.Errorf("Apply modified its input: %v", reqs[1].Time)
	}
}

func TestValidateScale(t *testing.T) {
	for _, s := range []float64{1, 0.5, 3, MinScale, MaxScale} {
		if err := ValidateScale(s); err != nil {
			t.Errorf("ValidateScale(%v) = %v", s, err)
		}
	}
	for _, s := range []float64{0, -1, math.NaN(), math.Inf(1), 1e-9, 1e12} { // 1e12: hours of simulated probes for a minute of trace
		if err := ValidateScale(s); err == nil {
			t.Errorf("ValidateScale(%v) = nil, want an error", s)
		}
	}
	defer func() {
		if recover() == nil {
			t.Errorf("Apply with time scale 0 did not panic")
		}
	}()
	Apply(nil, Window{}, 0)
}
