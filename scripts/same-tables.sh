#!/usr/bin/env bash
# Does a change leave the simulator's results alone? Runs `gorgo sim` with
# two binaries on the same cases and compares their tables byte for byte
# (the line giving the run's wall time left out): the default comparison,
# every registered policy on the embedded workload and on the Mooncake
# conversation trace at time scale 2, gorgo-online over the default
# policy, a mesh and admission.
#
# Usage: scripts/same-tables.sh OLD_GORGO NEW_GORGO   (about a minute)
#   e.g. git worktree add /tmp/old HEAD~3 && go build -o /tmp/old/gorgo /tmp/old/cmd/gorgo
#   TRACE=../shared/data/traces/mooncake_conversation_trace.jsonl (skipped when absent)
set -euo pipefail
old=${1:?usage: same-tables.sh OLD_GORGO NEW_GORGO}
new=${2:?usage: same-tables.sh OLD_GORGO NEW_GORGO}
trace=${TRACE:-$(dirname "$0")/../../shared/data/traces/mooncake_conversation_trace.jsonl}
all=$("$new" sim --help 2>&1 | sed -n 's/.*comma-separated POLICIES to compare: \(.*\) (default.*/\1/p' | tr -d ' ')
cases=(
	"--duration 10m"
	"--policy $all"
	"--policy gorgo-online --base default"
	"--topology paper-mesh --policy central,region-local,gorgo-e2e --sharing local,shared --duration 10m"
	"--ttft-slo 3s --policy gorgo-e2e,gorgo-ms --time-scale 0.5"
)
if [[ -f $trace ]]; then
	cases+=("--policy $all --trace $trace --time-scale 2")
else
	echo "same-tables: $trace not found: the Mooncake case is skipped" >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for c in "${cases[@]}"; do
	# shellcheck disable=SC2086
	"$old" sim $c 2>&1 | grep -v '^simulated .* in ' >"$tmp/old"
	# shellcheck disable=SC2086
	"$new" sim $c 2>&1 | grep -v '^simulated .* in ' >"$tmp/new"
	if cmp -s "$tmp/old" "$tmp/new"; then
		echo "same ($(wc -l <"$tmp/new") lines): gorgo sim ${c/$trace/TRACE}"
	else
		echo "DIFFERENT: gorgo sim ${c/$trace/TRACE}"
		diff "$tmp/old" "$tmp/new" | head -20
		fail=1
	fi
done
exit $fail
