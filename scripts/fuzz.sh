#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds each (default 10). `go test ./...`
# already runs each target's seed corpus (its f.Add seeds) as a test; this
# searches further. A crasher is written to the package's testdata/fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		echo "== $pkg $target (${secs}s)"
		go test -run XXX -fuzz "^$target\$" -fuzztime "${secs}s" "$pkg" | tail -n 1
	done
done
