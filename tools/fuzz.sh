#!/usr/bin/env bash
# Runs every Go fuzz target of the repository (every `func FuzzXxx` in a
# _test.go file), one after another, each for FUZZTIME (default 30s).
# A crashing input is saved by Go under the package's testdata/fuzz/ and
# fails the run; commit it as a regression seed once fixed.
#
# usage: tools/fuzz.sh             # make fuzz
#        FUZZTIME=3s tools/fuzz.sh # the short pass of make test
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-30s}
go=${GO:-go}
status=0
count=0
# package directory and target name of each fuzz target, sorted.
while read -r file name; do
  dir=$(dirname "$file")
  count=$((count + 1))
  echo "fuzz: ./$dir $name for $fuzztime"
  if ! "$go" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "./$dir" >/tmp/fuzz.$$.log 2>&1; then
    cat /tmp/fuzz.$$.log
    status=1
  fi
done < <(git ls-files -- '*_test.go' | xargs grep -H -o -E '^func Fuzz[A-Za-z0-9_]+' |
  sed -E 's/:func / /' | sort -u)
rm -f /tmp/fuzz.$$.log
if [ "$count" = 0 ]; then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi
echo "fuzz: $count targets, $([ $status = 0 ] && echo all clean || echo FAILED)"
exit $status
