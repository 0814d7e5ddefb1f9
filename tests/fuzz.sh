#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a while each:
#   tests/fuzz.sh [DURATION]     (default 3s; `make fuzz` gives 1m)
# Each target starts from its seeds (the f.Add calls, and testdata/fuzz/
# where a package has one); a failing input is written to that package's
# testdata/fuzz/<target>/ by the go tool, to be committed with its fix.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-3s}
failed=()
n=0
start=$(date +%s)
# The targets are read from the sources (func FuzzX(f *testing.F)), not
# with `go test -list`, which would build every package's tests first.
while read -r dir pkg; do
  targets=$(cat "$dir"/*_test.go 2>/dev/null | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(f \*testing\.F).*/\1/p' || true)
  for t in $targets; do
    n=$((n + 1))
    for try in 1 2 3; do
      if out=$(go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg" 2>&1); then
        break
      fi
      # The go tool sometimes ends a short run with "context deadline
      # exceeded" and no input: its own timing, not a finding. A finding
      # always names the input it wrote.
      if grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written' <<<"$out" && ((try < 3)); then
        echo "fuzz: $t ended on the go tool's deadline without a finding; again" >&2
        continue
      fi
      echo "$out" | tail -20
      failed+=("$pkg $t")
      break
    done
  done
done < <(go list -f '{{.Dir}} {{.ImportPath}}' ./...)
echo "fuzz: $n targets, ${fuzztime} each, $(( $(date +%s) - start )) s"
if ((${#failed[@]})); then
  printf 'fuzz: FAILED %s\n' "${failed[@]}"
  exit 1
fi
