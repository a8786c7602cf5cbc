#!/usr/bin/env bash
# A router in every region (docs/results.md, part 7): on paper-mesh (and
# paper-mesh-2), every arrangement under every sharing variant, with the
# embedded workload and the Mooncake trace, at a busy and a light load, with
# constant shares and with out-of-phase daily curves. Writes docs/results/mesh/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results/mesh
mkdir -p "$out"
go build -o /tmp/gorgo-mesh ./cmd/gorgo
g=/tmp/gorgo-mesh
moon=../shared/data/traces/mooncake_conversation_trace.jsonl
all="--policy central,region-local,skywalker,gorgo,gorgo-ms,default --sharing local,shared,omniscient"
for top in paper-mesh paper-mesh-2; do
	for ts in 1 3; do
		$g sim --topology $top --time-scale $ts $all | tee $out/$top-artchat-ts$ts.txt
		# One compressed day over the half hour: each region peaks in turn.
		$g sim --topology $top --time-scale $ts --day 30m $all | tee $out/$top-artchat-ts$ts-daily.txt
	done
	if [[ -f $moon ]]; then
		for ts in 1.5 3; do
			$g sim --topology $top --trace $moon --time-scale $ts $all | tee $out/$top-mooncake-ts$ts.txt
			# The trace spans 88 minutes at its own rate: one day over the run.
			day=$(awk -v s=$ts 'BEGIN{printf "%dm", 89*s}')
			$g sim --topology $top --trace $moon --time-scale $ts --day $day $all | tee $out/$top-mooncake-ts$ts-daily.txt
			# The trace's arrivals are 3 s ticks, a dozen requests at one
			# instant: the same runs with each tick spread over its gap.
			$g sim --topology $top --trace $moon --spread-ticks --time-scale $ts $all | tee $out/$top-mooncake-spread-ts$ts.txt
			$g sim --topology $top --trace $moon --spread-ticks --time-scale $ts --day $day $all | tee $out/$top-mooncake-spread-ts$ts-daily.txt
		done
	fi
done
# Each router alone, with engine gauges scraped every 30, 5 and 1 s.
for iv in 30s 5s 1s; do
	$g sim --topology paper-mesh --day 30m --policy default,least-load --sharing local --scrape-interval $iv | tee $out/scrape-$iv.txt
done
