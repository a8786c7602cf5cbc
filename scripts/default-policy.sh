#!/usr/bin/env bash
# The default policy's grid (docs/results.md, part 6): workloads {embedded
# artchat, chat preset, agent preset, Mooncake conversation} x three loads x
# fleets {paper, hetero.yaml, paper-200k.yaml}. In each workload and fleet,
# gorgo, gorgo-ms and the default policy (gorgo-e2e) are tuned on one window
# at the busy load and evaluated, frozen, on a held-out window at every load,
# against every other policy and clairvoyant. Then the admission study.
# Writes docs/results/grid/. `online` runs the grid again with the default
# policy tuning itself online (gorgo-online over it, with gorgo serve's
# settings) from its default weights, the first 10 minutes of each run a
# warm-up left out of every policy's figures; it needs the grid's tuned
# gorgo and gorgo-ms weights, and writes docs/results/grid-online/.
# `hindsight` (not part of `all`) runs the default policy at 36 fixed weight settings over the
# online grid's cells (HS_SEED, HS_OUT; see below).
# Usage: scripts/default-policy.sh [grid|admission|online|hindsight|all]
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results/grid
mkdir -p "$out"
go build -o /tmp/gorgo-grid ./cmd/gorgo
g=/tmp/gorgo-grid
what=${1:-all}
moon=../shared/data/traces/mooncake_conversation_trace.jsonl

# workload: trace file, tuning window, held-out window, loads (busy, middle, light).
# The busy load is where round-robin's p95 TTFT is >= 4x its p50 on the paper
# fleet (artchat, Mooncake); chat and agent are decode-bound, and round-robin's
# ratio stays near 2 at every load: there it is the heaviest load the paper's
# client (64 requests in flight) sustains without holding requests back.
declare -A file train test loads
for w in artchat chat agent; do
	file[$w]=/tmp/grid-$w-60m.jsonl
	$g trace gen --preset $w --duration 60m --seed 1 -o ${file[$w]} >/dev/null
	train[$w]=0s,30m
	test[$w]=30m,30m
done
train[agent]=0s,10m # 5,000+ requests a minute: ten-minute windows
test[agent]=30m,10m
loads[artchat]=1,1.5,3
loads[chat]=0.5,1,3
loads[agent]=4,6,12
file[mooncake]=$moon
train[mooncake]=0s,20m
test[mooncake]=20m,20m
loads[mooncake]=1.25,2,3

workloads="artchat chat agent"
if [[ -f $moon ]]; then workloads="$workloads mooncake"; else echo "skipping Mooncake: $moon not found" >&2; fi
fleets="paper examples/topologies/hetero.yaml examples/topologies/paper-200k.yaml"

if [[ $what == grid || $what == all ]]; then
	for w in $workloads; do
		busy=${loads[$w]%%,*}
		for f in $fleets; do
			tag=$w-$(basename $f .yaml)
			common="--trace ${file[$w]} --topology $f --window ${train[$w]} --time-scale $busy --generations 10"
			$g tune $common --out $out/$tag-gorgo.json >$out/$tag-tune-gorgo.txt
			$g tune $common --base gorgo-ms --param rtt=0.1:4:1 --param queue=0.1:4:1 --out $out/$tag-gorgo-ms.json >$out/$tag-tune-gorgo-ms.txt
			$g tune $common --base default --out $out/$tag-default.json >$out/$tag-tune-default.txt
			$g eval --trace ${file[$w]} --topology $f --window ${test[$w]} --sweep time-scale=${loads[$w]} \
				--weights $out/$tag-gorgo.json --ms-weights $out/$tag-gorgo-ms.json --e2e-weights $out/$tag-default.json \
				--json $out/$tag-eval.json --plots none >$out/$tag-eval.txt
			echo "$tag done" >&2
		done
	done
	go run ./scripts/grid -plot $out $out/*-eval.json | tee $out/grid.md
fi

if [[ $what == online || $what == all ]]; then
	# ONLINE_FLAGS adds tuner flags (e.g. "--early-stop 1.25"), ONLINE_OUT
	# writes elsewhere.
	on=${ONLINE_OUT:-docs/results/grid-online}
	read -ra extra <<<"${ONLINE_FLAGS:-}"
	# SLO goodput is scored against a TTFT SLO per workload: part 6's 3 s and 5 s for the embedded
	# workload and Mooncake, 1 s for the interactive chat and agent presets. TPOT=50ms (say) also
	# asks each request to keep its time per output token within it, and writes grid-online-tpot/.
	tpot=()
	if [[ -n ${TPOT:-} ]]; then
		on=${ONLINE_OUT:-docs/results/grid-online-tpot}
		tpot=(--goodput-tpot "$TPOT")
	fi
	mkdir -p "$on"
	declare -A slo=([artchat]=3s [chat]=1s [agent]=1s [mooncake]=5s)
	pols=default,gorgo-online,gorgo,gorgo-ms,simple-session-affinity,session-affinity,least-request,least-load,prefix-cache,round-robin,power-of-two,clairvoyant
	for w in $workloads; do
		for f in $fleets; do
			tag=$w-$(basename $f .yaml)
			$g eval --trace ${file[$w]} --topology $f --window ${test[$w]} --sweep time-scale=${loads[$w]} \
				--weights $out/$tag-gorgo.json --ms-weights $out/$tag-gorgo-ms.json --policy $pols \
				--live-tuner --score-from 10m --goodput-slo ${slo[$w]} "${tpot[@]}" "${extra[@]}" \
				--json $on/$tag-eval.json --plots none >$on/$tag-eval.txt
			echo "$tag done" >&2
		done
	done
	go run ./scripts/grid -policy gorgo-online -plot $on $on/*-eval.json | tee $on/grid.md
	go run ./scripts/grid $on/*-eval.json >$on/grid-fixed.md
	# The same two against the other policies alone (each without the other).
	go run ./scripts/grid -policy gorgo-online -exclude gorgo-e2e $on/*-eval.json >$on/grid-others.md
	go run ./scripts/grid -exclude gorgo-online $on/*-eval.json >$on/grid-fixed-others.md
fi

if [[ $what == hindsight ]]; then
	# The default policy at fixed weights, decode × itl over {0, 0.05, 0.1, 0.2, 0.4, 0.8}, on
	# every cell of the online grid at seed HS_SEED, beside the online grid's other policies at that
	# seed: what weights chosen per cell with hindsight would meet (scripts/grid -hindsight).
	# HS_TRAIN=1 runs the settings on the tuning windows too, to choose there. HS_OUT (relative to
	# the repository; no ':' in it) gets base/, sets/ and train-sets/; files already there are
	# kept (remove HS_OUT to run again from scratch).
	seed=${HS_SEED:-1}
	hs=${HS_OUT:-/tmp/gorgo-hindsight-seed$seed}
	[[ -d $hs/base ]] || TPOT= ONLINE_FLAGS="--seed $seed" ONLINE_OUT=$hs/base scripts/default-policy.sh online >/dev/null
	declare -A slo=([artchat]=3s [chat]=1s [agent]=1s [mooncake]=5s)
	kinds=sets
	[[ -n ${HS_TRAIN:-} ]] && kinds="sets train-sets"
	for kind in $kinds; do
		for d in 0 0.05 0.1 0.2 0.4 0.8; do
			for i in 0 0.05 0.1 0.2 0.4 0.8; do
				set=$hs/$kind/decode=$d,itl=$i
				mkdir -p "$set"
				for w in $workloads; do
					window=${test[$w]}
					[[ $kind == train-sets ]] && window=${train[$w]}
					for f in $fleets; do
						tag=$w-$(basename $f .yaml)
						[[ -f $set/$tag-eval.json ]] && continue
						$g eval --trace ${file[$w]} --topology $f --window $window --sweep time-scale=${loads[$w]} \
							--policy default --e2e-weights rtt=1,queue=1,decode=$d,itl=$i --seed "$seed" \
							--score-from 10m --goodput-slo ${slo[$w]} --json "$set/$tag-eval.json" --plots none >/dev/null
					done
				done
				echo "$kind decode=$d itl=$i done" >&2
			done
		done
	done
	groups=(-hindsight "$hs/base:$hs/sets")
	[[ -n ${HS_TRAIN:-} ]] && groups+=(-hindsight ":$hs/train-sets")
	go run ./scripts/grid -exclude gorgo-online "${groups[@]}"
fi

if [[ $what == admission || $what == all ]]; then
	pols=default,gorgo-ms,gorgo,least-load,round-robin
	# Overloaded cells, open loop (no client cap: overload shows as TTFT, not as requests held back).
	[[ -f $moon ]] && $g sim --trace $moon --time-scale 1 --max-inflight 0 --policy $pols --ttft-slo 5s --admission none,queue,reject \
		| tee $out/admission-mooncake.txt
	# Past the trace's own rate: 1/0.7 and twice it.
	[[ -f $moon ]] && for ts in 0.7 0.5; do
		$g sim --trace $moon --time-scale $ts --max-inflight 0 --policy default,gorgo-ms,round-robin --ttft-slo 5s --admission none,queue,reject
	done | tee $out/admission-mooncake-deep.txt
	$g sim --trace ${file[artchat]} --window 30m,30m --time-scale 0.75 --max-inflight 0 --policy $pols --ttft-slo 3s --admission none,queue,reject \
		| tee $out/admission-artchat.txt
	# The Azure LLM inference trace (conversation, 2023), when present: bursty arrivals, no prefix reuse.
	azure=${AZURE_CONV:-/tmp/azure_conv.csv}
	if [[ -f $azure ]]; then
		$g sim --trace $azure --window 0s,30m --time-scale 0.1 --max-inflight 0 --policy $pols --ttft-slo 3s --admission none,queue,reject \
			| tee $out/admission-azure.txt
	else
		echo "skipping Azure: set AZURE_CONV to AzureLLMInferenceTrace_conv.csv (github.com/Azure/AzurePublicDataset, data/)" >&2
	fi
fi
