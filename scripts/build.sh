#!/usr/bin/env bash
# Builds the daemon, the C++ client tools, the generated Python protocol module
# and the Python extension (offline), then copies them to .build/ (same
# relative paths as in bazel-bin). Tests and scripts use .build/ because
# bazel-bin flips to whichever configuration (-c opt, fastbuild) ran last.
# Last, the Python package as a wheel with that odbd inside, for Debian's
# /usr/bin/python3: .build/dist/odb-<version>-cp3X-cp3X-linux_x86_64.whl
# (README: `pip install --no-index .build/dist/odb-*.whl` in a venv).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh

targets=(//src/daemon:odbd //client/cpp:odb_synth //proto:odb_proto_py_gen)
if [ -f client/python/BUILD ]; then
  targets+=($(bazel query 'kind("cc_binary", //client/python/...)' 2>/dev/null))
fi
bazel build -c opt "${targets[@]}" 2>&1 | grep -vE "linux-sandbox" | tail -n 3
test "${PIPESTATUS[0]}" -eq 0

bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
for f in src/daemon/odbd client/cpp/odb_synth proto/odb_pb2.py client/python/_odb_native.so; do
  if [ -f "$bin/$f" ]; then
    mkdir -p ".build/$(dirname "$f")"
    cp -f "$bin/$f" ".build/$f.tmp" && mv -f ".build/$f.tmp" ".build/$f"
  fi
done

# The wheel (docs/python.md, "Install"): the extension compiles into .build/pip (kept, so a rebuild
# and a later `pip install --no-build-isolation ./client/python` reuse its objects); odbd is the
# one just built (no second Bazel run). One wheel in .build/dist, so `odb-*.whl` names it.
rm -rf .build/dist
ODB_BUILD_DIR="$PWD/.build/pip" ODB_ODBD_BINARY="$PWD/.build/src/daemon/odbd" ODB_REQUIRE_ODBD=1 \
  PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  /usr/bin/python3 -m pip wheel --no-build-isolation --no-deps -q -w .build/dist ./client/python 2>&1 | tail -n 5
test "${PIPESTATUS[0]}" -eq 0
echo "built into .build/ (wheel: $(ls .build/dist/odb-*.whl))"
