// Command gorgo is a cross-region, network-aware LLM request router, with the
// simulator and tools to evaluate it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands []command

func init() {
	commands = []command{
		{"demo", "run regions, replicas, the proxy and several policies live, side by side", runDemo},
		{"serve", "run the OpenAI-compatible routing proxy in front of engine replicas", runServe},
		{"epp", "serve Envoy's ext_proc endpoint-picker protocol: gorgo inside Envoy-based gateways", runEPP},
		{"sim", "simulate routing policies over a workload and compare them", runSim},
		{"tune", "tune gorgo's weights on a window of a workload", runTune},
		{"eval", "evaluate tuned gorgo against every baseline on held-out windows", runEval},
		{"engine", "serve an emulated SGLang/vLLM replica (no GPU needed)", runEngine},
		{"replay", "replay a workload against an OpenAI-compatible server", runReplay},
		{"trace", "generate a synthetic workload (gen) or describe one (stats)", runTrace},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes a command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			return run([]string{args[1], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == name {
			err := c.run(args[1:], stdout, stderr)
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.Is(err, errUsage):
				return 2
			default:
				fmt.Fprintf(stderr, "gorgo %s: %v\n", name, err)
				return 1
			}
		}
	}
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	fmt.Fprintf(stderr, "gorgo: unknown command %q (commands: %s; run 'gorgo help')\n", name, strings.Join(names, ", "))
	return 2
}

// errUsage reports a command line error already explained to the user.
var errUsage = errors.New("usage error")

func usage(w io.Writer) {
	fmt.Fprintln(w, "gorgo routes LLM requests across regions to the replica with the lowest estimated time to first token.")
	fmt.Fprintln(w, "\nUsage: gorgo COMMAND [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'gorgo COMMAND -h' for a command's flags.")
}

// newFlagSet returns a flag set whose usage names the command and explains it.
func newFlagSet(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: gorgo %s\n\n%s\n\nFlags:\n", synopsis, strings.TrimSpace(about))
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args. -h prints the command's usage; a bad command
// line prints one line (the error and where to look) and maps to errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	fmt.Fprintf(out, "gorgo %s: %v (run 'gorgo %s -h' for its flags)\n", fs.Name(), err, fs.Name())
	return errUsage
}
