#!/usr/bin/env bash
# The whole test suite: installs what it needs, builds, runs the Catch2/spin
# tests through Bazel and the multi-process integration tests through pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install_deps.sh
./scripts/build.sh

echo "== bazel test -c opt //... (same configuration as scripts/build.sh: nothing is compiled twice)"
set +e  # a failing Bazel target must not skip the pytest half: both results are reported
bazel test -c opt --keep_going //... --test_tag_filters=-benchmark 2>&1 | grep -vE "linux-sandbox" | tail -n 60
bazel_rc=${PIPESTATUS[0]}

echo "== pytest tests/"
/usr/bin/python3 -m pytest tests -q -p no:cacheprovider
py_rc=$?
set -e

if [ "$bazel_rc" -ne 0 ] || [ "$py_rc" -ne 0 ]; then
  echo "FAILED: bazel rc=$bazel_rc pytest rc=$py_rc"
  exit 1
fi
echo "all tests passed"
