package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

// workloadFlags select and shape the workload of sim, tune and eval.
type workloadFlags struct {
	file      string
	format    string
	preset    string
	duration  time.Duration
	window    string
	timeScale float64
	seed      uint64
}

func (w *workloadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&w.file, "trace", "", "workload trace `FILE` (JSONL); without it, the embedded synthetic workload")
	fs.StringVar(&w.format, "format", "auto", "trace format: auto, mooncake or gorgo")
	fs.StringVar(&w.preset, "preset", "artchat", "synthetic workload when no --trace: "+joinNames(trace.Presets()))
	fs.DurationVar(&w.duration, "duration", 30*time.Minute, "length of the synthetic workload")
	fs.StringVar(&w.window, "window", "", "part of the trace to use, as `START,DURATION` Go durations (e.g. 0s,30m); default all")
	fs.Float64Var(&w.timeScale, "time-scale", 1, "multiply inter-arrival gaps by `F` (2 = half the request rate)")
	fs.Uint64Var(&w.seed, "seed", 1, "random seed (synthetic workload, network jitter, policies)")
}

// load reads or generates the workload and applies the window and time scale.
// It returns the requests and a one-line description.
func (w *workloadFlags) load() ([]trace.Request, string, error) {
	if err := trace.ValidateScale(w.timeScale); err != nil {
		return nil, "", fmt.Errorf("--time-scale: %w", err)
	}
	var win trace.Window
	if w.window != "" {
		var err error
		if win, err = trace.ParseWindow(w.window); err != nil {
			return nil, "", fmt.Errorf("--window: %w", err)
		}
	}
	var reqs []trace.Request
	var src string
	if w.file != "" {
		f, err := trace.ParseFormat(w.format)
		if err != nil {
			return nil, "", fmt.Errorf("--format: %w", err)
		}
		if reqs, err = trace.ReadFile(w.file, f); err != nil {
			return nil, "", err
		}
		src = w.file
	} else {
		var err error
		reqs, err = trace.Generate(trace.GenConfig{Preset: w.preset, Seed: w.seed, Duration: w.duration})
		if err != nil {
			return nil, "", err
		}
		src = fmt.Sprintf("synthetic %s (%v, seed %d)", w.preset, w.duration, w.seed)
	}
	reqs = trace.Apply(reqs, win, w.timeScale)
	if len(reqs) == 0 {
		return nil, "", fmt.Errorf("the workload has no requests in window %q", w.window)
	}
	desc := fmt.Sprintf("%s: %d requests over %v", src, len(reqs), reqs[len(reqs)-1].Time.Round(time.Second))
	if w.window != "" {
		desc += ", window " + w.window
	}
	if w.timeScale != 1 {
		desc += fmt.Sprintf(", time scale %g", w.timeScale)
	}
	return reqs, desc, nil
}
