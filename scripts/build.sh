#!/usr/bin/env bash
# Builds the daemon, the C++ client tools, the generated Python protocol module
# and the Python extension (offline), then copies them to .build/ (same
# relative paths as in bazel-bin). Tests and scripts use .build/ because
# bazel-bin flips to whichever configuration (-c opt, fastbuild) ran last.
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
echo "built into .build/"
