package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// Text prompts are hashed in blocks of benchBlockTokens estimated tokens
// of bytesPerToken bytes each, as the proxy does.
const (
	benchBlockTokens = 256
	bytesPerToken    = 4
	indexedBlocks    = 1 << 20
)

// benchRouter returns a router with the named policy over n replicas whose prefix index
// already holds about 1M blocks, and a prompt of the given length that a
// few replicas hold parts of.
func benchRouter(b *testing.B, name string, n, promptTokens int) (*Router, []byte) {
	b.Helper()
	p, perr := policy.New(name, policy.Options{})
	if perr != nil {
		b.Fatal(perr)
	}
	reps := make([]ReplicaConfig, n)
	perReplica := indexedBlocks/n + indexedBlocks/8
	for i := range reps {
		reps[i] = ReplicaConfig{ID: fmt.Sprintf("r%d", i), KVCapacityTokens: perReplica * benchBlockTokens, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}
	}
	r, err := New(Config{Replicas: reps, Policy: p, BlockTokens: benchBlockTokens})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		r.ObserveRTT(reps[i].ID, time.Duration(10+rng.IntN(400))*time.Millisecond)
	}
	slot := func(i int) int { return r.fleet.Load().byID[reps[i].ID].slot }
	chain := make([]uint64, 128)
	for k := 0; r.index.Len() < indexedBlocks; k++ {
		for j := range chain {
			chain[j] = rng.Uint64()
		}
		r.index.Insert(slot(k%n), chain)
	}
	prompt := make([]byte, promptTokens*bytesPerToken)
	for i := range prompt {
		prompt[i] = byte('a' + rng.IntN(26))
	}
	blocks := prefix.Chain(prompt, benchBlockTokens*bytesPerToken, nil)
	// Three replicas hold the first 100%, 50% and 10% of the prompt.
	for j, frac := range []float64{1, 0.5, 0.1} {
		r.index.Insert(slot(j%n), blocks[:int(frac*float64(len(blocks)))])
	}
	return r, prompt
}

// BenchmarkDecide is one routing decision as the proxy makes it: hash the
// prompt into chained blocks, find every replica's cached prefix, build the
// replica views and score them, with the paper's policy and the default
// one.
func BenchmarkDecide(b *testing.B) {
	for _, name := range []string{"gorgo", policy.DefaultName} {
		for _, n := range []int{3, 16, 64, 256, 1000} {
			for _, tokens := range []int{2 << 10, 32 << 10} {
				benchDecide(b, name, n, tokens)
			}
		}
	}
}

func benchDecide(b *testing.B, name string, n, tokens int) {
	b.Run(fmt.Sprintf("policy=%s/replicas=%d/prompt=%dk", name, n, tokens>>10), func(b *testing.B) {
		r, prompt := benchRouter(b, name, n, tokens)
		rng := rand.New(rand.NewPCG(3, 4))
		buf := make([]uint64, 0, len(prompt)/(benchBlockTokens*bytesPerToken)+1)
		req := &policy.Request{PromptTokens: tokens}
		b.ReportAllocs()
		b.SetBytes(int64(len(prompt)))
		for b.Loop() {
			buf = prefix.Chain(prompt, benchBlockTokens*bytesPerToken, buf[:0])
			req.Blocks = buf
			if _, err := r.Decide(0, req, rng); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRoute is a decision plus its bookkeeping: the ledger and the
// insertion of the prompt's blocks into the chosen replica's index.
func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{16} {
		for _, tokens := range []int{2 << 10, 32 << 10} {
			b.Run(fmt.Sprintf("replicas=%d/prompt=%dk", n, tokens>>10), func(b *testing.B) {
				r, prompt := benchRouter(b, "gorgo", n, tokens)
				rng := rand.New(rand.NewPCG(3, 4))
				buf := make([]uint64, 0, len(prompt)/(benchBlockTokens*bytesPerToken)+1)
				req := &policy.Request{PromptTokens: tokens}
				b.ReportAllocs()
				for b.Loop() {
					buf = prefix.Chain(prompt, benchBlockTokens*bytesPerToken, buf[:0])
					req.Blocks = buf
					t, err := r.Route(0, req, rng)
					if err != nil {
						b.Fatal(err)
					}
					r.Finish(&t)
				}
			})
		}
	}
}

// BenchmarkDecideWithAdapters is BenchmarkDecide's 16 replicas and 32k
// tokens with models and adapters in play: every replica serves a base
// model and 32 LoRA adapters on it, with 4 slots each, each slot's adapter
// recently used there, and the request is for an adapter (its residency
// and cost are looked up at every replica).
func BenchmarkDecideWithAdapters(b *testing.B) {
	for _, name := range []string{"gorgo", policy.DefaultName} {
		b.Run("policy="+name+"/replicas=16/prompt=32k", func(b *testing.B) {
			r, prompt := benchRouter(b, name, 16, 32<<10)
			adapters := make([]string, 32)
			for i := range adapters {
				adapters[i] = fmt.Sprintf("lora-%d", i)
			}
			served, err := models.WithAdapters([]string{"llama"}, adapters)
			if err != nil {
				b.Fatal(err)
			}
			for i, m := range r.fleet.Load().members {
				r.SetModels(m.id, served)
				for k := range 4 {
					m.adapters.start(adapters[(i+k)%len(adapters)], time.Duration(k))
					m.adapters.end(adapters[(i+k)%len(adapters)])
				}
			}
			// As in benchRouter, three replicas hold parts of the prompt,
			// here under the adapter's key.
			req := &policy.Request{PromptTokens: 32 << 10, Model: "lora-5"}
			keyed := prefix.Keyed(prefix.Chain(prompt, benchBlockTokens*bytesPerToken, nil), prefix.ModelKey(req.Model))
			for j, frac := range []float64{1, 0.5, 0.1} {
				r.index.Insert(r.fleet.Load().members[j].slot, keyed[:int(frac*float64(len(keyed)))])
			}
			rng := rand.New(rand.NewPCG(3, 4))
			buf := make([]uint64, 0, len(prompt)/(benchBlockTokens*bytesPerToken)+1)
			b.ReportAllocs()
			b.SetBytes(int64(len(prompt)))
			for b.Loop() {
				buf = prefix.Keyed(prefix.Chain(prompt, benchBlockTokens*bytesPerToken, buf[:0]), prefix.ModelKey(req.Model))
				req.Blocks = buf
				if _, err := r.Decide(0, req, rng); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecideTuned is BenchmarkDecide's 16 replicas with the default
// policy under the online tuner, as gorgo serve runs it: the tuner adds a
// lock, an arm's turn and a tag to each decision. The router's clock moves
// 1 ms a decision, so the arms take turns in blocks of a minute.
func BenchmarkDecideTuned(b *testing.B) {
	for _, tokens := range []int{2 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("replicas=16/prompt=%dk", tokens>>10), func(b *testing.B) {
			r, prompt := benchRouter(b, policy.DefaultName, 16, tokens)
			o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName, Window: 256, Block: time.Minute, ES: tune.Config{Seed: 1, Sigma: 0.3}})
			if err != nil {
				b.Fatal(err)
			}
			r.cfg.Policy = o
			rng := rand.New(rand.NewPCG(3, 4))
			buf := make([]uint64, 0, len(prompt)/(benchBlockTokens*bytesPerToken)+1)
			req := &policy.Request{PromptTokens: tokens}
			var now time.Duration
			b.ReportAllocs()
			for b.Loop() {
				buf = prefix.Chain(prompt, benchBlockTokens*bytesPerToken, buf[:0])
				req.Blocks = buf
				now += time.Millisecond
				if _, err := r.Decide(now, req, rng); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRouteInAMesh is a request's routing (Route, then Finish) by
// the default policy at 16 replicas, for a router alone and for one of a
// mesh of three: there each replica keeps the flows of two other routers'
// dispatches (unheard.go), which every decision reads, and the router
// records its decisions' times.
func BenchmarkRouteInAMesh(b *testing.B) {
	for _, meshed := range []bool{false, true} {
		for _, tokens := range []int{2 << 10, 32 << 10} {
			b.Run(fmt.Sprintf("mesh=%v/replicas=16/prompt=%dk", meshed, tokens>>10), func(b *testing.B) {
				r, prompt := benchRouter(b, policy.DefaultName, 16, tokens)
				for i, m := range r.fleet.Load().members {
					if !meshed {
						break
					}
					for k, name := range []string{"eu", "ap"} {
						t, ok := r.Enter(0, m.id, &policy.Request{PromptTokens: 1000 * (i + 1)}, OutputKeys{},
							Origin{Name: name, Leg: time.Duration(40*(k+1)) * time.Millisecond, RTT: time.Duration(5*(i+1)) * time.Millisecond})
						if !ok {
							b.Fatal("not entered")
						}
						r.Finish(&t) // the flows stay
					}
				}
				rng := rand.New(rand.NewPCG(3, 4))
				buf := make([]uint64, 0, len(prompt)/(benchBlockTokens*bytesPerToken)+1)
				req := &policy.Request{PromptTokens: tokens}
				now := time.Minute // the flows long heard of
				b.ReportAllocs()
				for b.Loop() {
					buf = prefix.Chain(prompt, benchBlockTokens*bytesPerToken, buf[:0])
					req.Blocks = buf
					now += time.Millisecond
					t, err := r.Route(now, req, rng)
					if err != nil {
						b.Fatal(err)
					}
					r.Finish(&t)
				}
			})
		}
	}
}
