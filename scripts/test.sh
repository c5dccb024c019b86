#!/usr/bin/env bash
# The test suite: installs what it needs, builds, runs the Catch2/spin tests through Bazel and
# the multi-process integration tests through pytest.
#
#   ./scripts/test.sh            the whole suite (what CI runs: .ci/run)
#   ./scripts/test.sh --quick    the Bazel tests and the pytest selection in tests/quick.txt (a few
#                                fast tests of every area): the edit-test loop, minutes not a quarter hour
#
# Both print their time and the load average (the machine is shared: a loaded one is slower).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: $0 [--quick]   (no option: the whole suite; --quick: Bazel tests + tests/quick.txt)" >&2; exit 2 ;;
esac
start=$(date +%s)
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)

./scripts/install_deps.sh
./scripts/build.sh

echo "== bazel test -c opt //... (same configuration as scripts/build.sh: nothing is compiled twice)"
set +e  # a failing Bazel target must not skip the pytest half: both results are reported
bazel test -c opt --keep_going //... --test_tag_filters=-benchmark 2>&1 | grep -vE "linux-sandbox" | tail -n 60
bazel_rc=${PIPESTATUS[0]}

if [ "$quick" = 1 ]; then
  mapfile -t selection < <(grep -vE '^[[:space:]]*(#|$)' tests/quick.txt)
  echo "== pytest: the quick selection (tests/quick.txt, ${#selection[@]} entries)"
  /usr/bin/python3 -m pytest "${selection[@]}" -q -p no:cacheprovider
else
  echo "== pytest tests/"
  /usr/bin/python3 -m pytest tests -q -p no:cacheprovider
fi
py_rc=$?
set -e

what=$([ "$quick" = 1 ] && echo "quick tests" || echo "whole suite")
echo "$what: $(( $(date +%s) - start ))s on $(nproc) cores; load average $load_at_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
if [ "$bazel_rc" -ne 0 ] || [ "$py_rc" -ne 0 ]; then
  echo "FAILED: bazel rc=$bazel_rc pytest rc=$py_rc"
  exit 1
fi
echo "all tests passed"
