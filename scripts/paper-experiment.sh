#!/usr/bin/env bash
# Reproduces the paper's experiment in the simulator: tune gorgo's weights on
# one window, evaluate them frozen against every baseline on two held-out
# windows over a load sweep, and the reward-hacking case (w_queue -> 0) with
# and without the guardrail. Writes weights, tables (JSON) and plots to
# docs/results/. Usage: scripts/paper-experiment.sh [artchat|mooncake|all]
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results
mkdir -p "$out"
go build -o /tmp/gorgo-exp ./cmd/gorgo
g=/tmp/gorgo-exp
what=${1:-all}

if [[ $what == artchat || $what == all ]]; then
	# The embedded workload: 90 minutes of synthetic ART-Chat, three 30-minute windows.
	tr=/tmp/artchat-90m.jsonl
	$g trace gen --preset artchat --duration 90m --seed 1 -o $tr
	$g tune --trace $tr --window 0s,30m --time-scale 1 --mode offline --out $out/artchat-weights.json | tee $out/artchat-tune.txt
	$g tune --trace $tr --window 0s,30m --time-scale 1 --mode online --out $out/artchat-weights-online.json | tee $out/artchat-tune-online.txt
	$g tune --trace $tr --window 0s,30m --time-scale 1 --base gorgo-ms --param rtt=0.1:4:1 --param queue=0.1:4:1 \
		--out $out/artchat-weights-ms.json | tee $out/artchat-tune-ms.txt
	$g eval --trace $tr --weights $out/artchat-weights.json --ms-weights $out/artchat-weights-ms.json --window 30m,30m --window 60m,30m \
		--sweep time-scale=1,1.5,2,3 --json $out/artchat-eval.json --plots $out/artchat-cdf | tee $out/artchat-eval.txt
	# Reward hacking: let w_queue fall to (almost) zero. Tuning p95 TTFT, without a guard; tuning
	# p50 TTFT (which the nearest replica wins), without a guard and with a tight one; and w_queue = 0.
	free="--param rtt=0.05:8:0.5 --param queue=0.001:0.5:0.1"
	$g tune --trace $tr --window 0s,30m $free --guard none --out $out/hack-p95-noguard.json | tee $out/hack-p95-noguard.txt
	$g tune --trace $tr --window 0s,30m $free --objective p50-ttft --guard none --out $out/hack-p50-noguard.json | tee $out/hack-p50-noguard.txt
	$g tune --trace $tr --window 0s,30m $free --objective p50-ttft --guard e2e-p95=1.01 --out $out/hack-p50-guard.json | tee $out/hack-p50-guard.txt
	for w in $out/hack-p95-noguard.json $out/hack-p50-noguard.json $out/hack-p50-guard.json rtt=0.23,queue=0; do
		$g eval --trace $tr --weights $w --window 30m,30m --window 60m,30m --sweep time-scale=1,2 \
			--policy gorgo,simple-session-affinity --plots none
	done | tee $out/hack-eval.txt
fi

if [[ $what == mooncake || $what == all ]]; then
	tr=../shared/data/traces/mooncake_conversation_trace.jsonl
	if [[ ! -f $tr ]]; then echo "skipping Mooncake: $tr not found" >&2; exit 0; fi
	# 59 minutes: tune on the first 20, hold out the next two 20-minute windows.
	$g tune --trace $tr --window 0s,20m --time-scale 1.5 --mode offline --out $out/mooncake-weights.json | tee $out/mooncake-tune.txt
	$g tune --trace $tr --window 0s,20m --time-scale 1.5 --base gorgo-ms --param rtt=0.1:4:1 --param queue=0.1:4:1 \
		--out $out/mooncake-weights-ms.json | tee $out/mooncake-tune-ms.txt
	$g eval --trace $tr --weights $out/mooncake-weights.json --ms-weights $out/mooncake-weights-ms.json --window 20m,20m --window 40m,20m \
		--sweep time-scale=1.5,2,3 --json $out/mooncake-eval.json --plots $out/mooncake-cdf | tee $out/mooncake-eval.txt
fi
