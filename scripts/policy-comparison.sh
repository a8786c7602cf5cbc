#!/usr/bin/env bash
# The routing issue's comparisons: every policy on the embedded workload and
# on the Mooncake conversation trace (paper topology, busy), seeds and load
# sweeps, a smaller KV cache, and a fleet of unequal hardware. Writes the
# tables to docs/results/compare-*.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results
mkdir -p "$out"
go build -o /tmp/gorgo-cmp ./cmd/gorgo
g=/tmp/gorgo-cmp
mc=../shared/data/traces/mooncake_conversation_trace.jsonl

$g sim | tee $out/compare-artchat.txt
for s in 2 3 4 5; do $g sim --seed $s --quiet --policy gorgo,gorgo-ms,round-robin,simple-session-affinity,clairvoyant; done | tee $out/compare-artchat-seeds.txt
$g sim --topology examples/topologies/hetero.yaml | tee $out/compare-hetero.txt
for r in online blind; do $g sim --topology examples/topologies/hetero.yaml --policy gorgo-ms --ms-rates $r --quiet; done | tee $out/compare-hetero-rates.txt
$g sim --topology examples/topologies/paper-200k.yaml --quiet | tee $out/compare-artchat-200k.txt
$g sim --fleet-event "10m drain ap-seoul" --fleet-event "15m undrain ap-seoul" --split 10m,15m,20m | tee $out/fleet-drain-artchat.txt
if [[ -f $mc ]]; then
	$g sim --trace $mc --time-scale 1.5 | tee $out/compare-mooncake.txt
	for s in 2 3 4 5; do $g sim --trace $mc --time-scale 1.5 --seed $s --quiet --policy gorgo,gorgo-ms,round-robin,simple-session-affinity,clairvoyant; done | tee $out/compare-mooncake-seeds.txt
	for ts in 2 3; do $g sim --trace $mc --time-scale $ts --quiet --policy gorgo,gorgo-ms,round-robin,least-load,session-affinity,clairvoyant; done | tee $out/compare-mooncake-sweep.txt
fi
