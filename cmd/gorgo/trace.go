package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

const traceAbout = `
  gorgo trace gen [--preset artchat|chat|agent|apps] [--duration D] [--rate R] [--seed N] [--models NAME:W,...] [-o FILE]
      writes a synthetic workload in gorgo's JSONL format (to stdout without -o).
  gorgo trace stats [--format F] [--window START,DURATION] [--time-scale S] [--json] FILE   (flags before FILE)
      describes a workload: requests, rate, input and output lengths, sessions,
      turns, prefix reuse, and the models' shares when requests name models.`

func runTrace(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "gen" && args[0] != "stats") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintf(stdout, "Usage:\n%s\n", strings.TrimPrefix(traceAbout, "\n"))
			return nil
		}
		if len(args) == 0 {
			return errors.New("want a subcommand: gen or stats (run 'gorgo trace -h')")
		}
		return fmt.Errorf("unknown subcommand %q: want gen or stats (run 'gorgo trace -h')", args[0])
	}
	if args[0] == "gen" {
		return runTraceGen(args[1:], stdout, stderr)
	}
	return runTraceStats(args[1:], stdout, stderr)
}

func runTraceGen(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("trace gen", "trace gen [flags]", "Writes a synthetic workload in gorgo's JSONL format.", stderr)
	preset := fs.String("preset", "artchat", "workload shape: "+joinNames(trace.Presets()))
	duration := fs.Duration("duration", 30*time.Minute, "length of the workload")
	seed := fs.Uint64("seed", 1, "random seed")
	rate := fs.Float64("rate", 0, "mean request rate in requests/s (0 = the preset's)")
	mix := fs.String("models", "", "each session names one model, drawn by weight from `NAME:W,NAME:W,...` (written as \"model\")")
	out := fs.String("o", "", "output `FILE` (default stdout)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *duration <= 0 {
		return fmt.Errorf("--duration must be positive, got %v", *duration)
	}
	var weights []trace.ModelWeight
	if *mix != "" {
		var err error
		if weights, err = trace.ParseModelWeights(*mix); err != nil {
			return fmt.Errorf("--models: %w", err)
		}
	}
	w := stdout
	var f *os.File
	if *out != "" { // before the work: an unwritable path fails at once
		var err error
		if f, err = os.Create(*out); err != nil {
			return err
		}
		w = f
	}
	reqs, err := trace.Generate(trace.GenConfig{Preset: *preset, Seed: *seed, Duration: *duration, Rate: *rate})
	if err != nil {
		return err
	}
	trace.AssignModels(reqs, weights, *seed)
	bw := bufio.NewWriterSize(w, 1<<16)
	if err := trace.Write(bw, reqs); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %d requests to %s\n", len(reqs), *out)
	}
	return nil
}

func runTraceStats(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("trace stats", "trace stats [flags] FILE", "Describes a workload trace.", stderr)
	format := fs.String("format", "auto", "trace format: auto (detected), mooncake, gorgo, azure (Azure LLM inference CSV) or burstgpt (BurstGPT CSV)")
	window := fs.String("window", "", "part of the trace, as `START,DURATION` Go durations; default all")
	scale := fs.Float64("time-scale", 1, "multiply inter-arrival gaps by `F`")
	asJSON := fs.Bool("json", false, "print the statistics as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("want one trace FILE, after the flags (run 'gorgo trace stats -h')")
	}
	wl := workloadFlags{file: fs.Arg(0), format: *format, window: *window, timeScale: *scale}
	reqs, _, err := wl.load()
	if err != nil {
		return err
	}
	st := trace.ComputeStats(reqs)
	st.OutputError = sim.OutputError(reqs)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return st.WriteText(stdout)
}
