#!/usr/bin/env bash
# How well the router expects an answer's length (docs/results.md, part 10,
# "Answers' lengths from their application and their conversation"): the
# estimate's error on each workload (gorgo trace stats), then the default
# policy with the keyed estimate against the running mean alone on the apps
# preset (paper fleet, hetero.yaml), whose applications answer at lengths of their own: the mean over
# seeds of p95/p99 TTFT and E2E, at three loads, with and without the
# requests' max_tokens shown to the router.
# Usage: scripts/output-estimate.sh [seeds]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o /tmp/gorgo-outputs ./cmd/gorgo
g=/tmp/gorgo-outputs
seeds=${1:-5}
moon=../shared/data/traces/mooncake_conversation_trace.jsonl

for w in apps chat agent artchat; do
	$g trace gen --preset $w --duration 60m --seed 1 -o /tmp/outputs-$w-60m.jsonl >/dev/null
	printf '%-8s %s\n' $w "$($g trace stats /tmp/outputs-$w-60m.jsonl | grep 'estimate error' | sed 's/^ *//')"
done
if [[ -f $moon ]]; then
	printf '%-8s %s\n' mooncake "$($g trace stats $moon | grep 'estimate error' | sed 's/^ *//')"
else
	echo "skipping Mooncake: $moon not found" >&2
fi

for top in paper examples/topologies/hetero.yaml; do
	echo
	echo "apps on $(basename $top .yaml), default policy, window 10m,50m, mean over seeds 1-$seeds: global -> keyed"
	for hide in --hide-max-tokens ""; do
		echo "${hide:-max_tokens shown}"
		for ts in 0.5 1 3; do
			for est in global keyed; do
				for s in $(seq 1 "$seeds"); do
					# gorgo-e2e's row: TTFT p95 ($6) and p99 ($7), E2E p95 ($10) and p99 ($11).
					$g sim --trace /tmp/outputs-apps-60m.jsonl --topology $top --window 10m,50m --seed $s --time-scale $ts \
						--policy default --output-estimate $est $hide | awk -v e=$est '$1 == "gorgo-e2e" {gsub(",", ""); print e, $6, $7, $10, $11}'
				done
			done | awk -v ts=$ts '{n[$1]++; for (i = 2; i <= 5; i++) v[$1, i] += $i}
				END {printf "  time scale %-4s", ts; split("p95-TTFT p99-TTFT p95-E2E p99-E2E", name, " ")
					for (i = 2; i <= 5; i++) { g = v["global", i] / n["global"]; k = v["keyed", i] / n["keyed"]
						printf "  %s %.0f -> %.0f (%+.1f%%)", name[i-1], g, k, (k / g - 1) * 100 }
					print "" }'
		done
	done
done
