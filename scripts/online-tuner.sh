#!/usr/bin/env bash
# The online tuner's safety (docs/results.md, "Tuning online"): the reward
# hack offered (p50 TTFT with w_queue free to fall to 0.001; the default
# policy's decode weights free to fall to a tenth) tuned in the paper's
# hops of 32 requests and in gorgo serve's one-minute blocks; and a change
# of the fleet under the tuner. Each run tunes from the start and is
# scored from its 10th minute. Writes docs/results/online/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results/online
mkdir -p "$out"
go build -o /tmp/gorgo-online ./cmd/gorgo
g=/tmp/gorgo-online
art=/tmp/artchat-90m.jsonl
agent=/tmp/grid-agent-60m.jsonl
[[ -f $art ]] || $g trace gen --preset artchat --duration 90m --seed 1 -o $art >/dev/null
[[ -f $agent ]] || $g trace gen --preset agent --duration 60m --seed 1 -o $agent >/dev/null
hops="--hop 32 --window-requests 128"
blocks="--block 60s --window-requests 256 --sigma 0.3 --confirm --early-stop 1.5"

# The paper's hack: gorgo tuned on p50 TTFT, w_queue allowed down to 0.001.
free="--base gorgo --param rtt=0.05:8:0.5 --param queue=0.001:0.5:0.1 --objective p50-ttft --guard e2e-p95=1.05"
for mode in hops blocks; do
	$g sim --trace $art --policy gorgo,gorgo-online $free ${!mode} --score-from 10m --quiet | tee $out/hack-artchat-$mode.txt
done
# The default policy's hack: on agent-like traffic the TTFT-greedy weights
# (decode and itl near zero: gorgo-ms) pile requests near and the decode
# crawls there.
for mode in hops blocks; do
	$g sim --trace $agent --window 30m,10m --time-scale 6 --policy default,gorgo-online --base default ${!mode} \
		--score-from 10m --quiet | tee $out/hack-agent-$mode.txt
done

# What the operator asks for: the same agent window tuned for p95 E2E instead,
# with and without confirmation of a win.
$g sim --trace $agent --window 30m,10m --time-scale 6 --policy default,gorgo,session-affinity,gorgo-online --base default $blocks \
	--objective p95-e2e --guard none --score-from 10m --quiet | tee $out/agent-e2e-objective.txt
$g sim --trace $agent --window 30m,10m --time-scale 6 --policy gorgo-online --base default $blocks --confirm=false \
	--objective p95-e2e --guard none --score-from 10m --quiet | tee $out/agent-e2e-objective-unconfirmed.txt

# A change of the fleet: after 30 minutes tuning on the embedded workload, a
# fourth replica joins in us-ashburn; the tuner falls back to its starting
# weights and tunes again on the new fleet.
$g sim --trace $art --window 0s,60m --policy default,gorgo-online --base default $blocks \
	--fleet-event "30m add us-ashburn-2 region=us-ashburn" --split 10m,20m,30m,40m,50m | tee $out/fleet-change.txt
# The same without the early stop: this tuner has moved by the change, and
# falls back.
$g sim --trace $art --window 0s,60m --policy default,gorgo-online --base default $blocks --early-stop 0 \
	--fleet-event "30m add us-ashburn-2 region=us-ashburn" --split 10m,20m,30m,40m,50m | tee $out/fleet-change-no-early-stop.txt
