#!/usr/bin/env bash
# bench/gpu_run.sh: the GPU benchmark, run in the repository root of a GPU machine that has
# Python with torch (CUDA) and a C++ compiler, but no network, no Bazel, no libzmq, no C++
# protobuf and no protoc. Everything native comes from the bundle that bench/gpu_bundle.sh
# made on the development machine (.gpu/, carried along with the working tree):
#
#   1. diagnostics: OS, CPUs, nvidia-smi, python/torch/numpy/pybind11/setuptools, g++, the bundle;
#   2. odbd: the bundle's wrapper (.gpu/bin/odbd: its own libraries, nobody else sees them);
#   3. the Python extension, compiled here for this interpreter: `pip install
#      --no-build-isolation --target` of ./client/python with setup.py's static route
#      (ODB_STATIC_DEPS: the bundle's PIC archives of ZeroMQ, protobuf-lite, abseil; the
#      bundle's headers; ODB_PROTO_GENERATED: protoc's code made there), or, if pip fails, the
#      same sources compiled directly with $CXX; ldd must show no libzmq/libprotobuf/abseil;
#   4. smoke test without torch: `python -m odb.cli demo` (2 daemons, producers, consumers);
#   5. the benchmarks (BENCHES below; default: the Standard vs odb demo on the GPU).
#
# Output: the whole transcript in gpu_run.log, the build's in gpu_build.log, per benchmark
# NAME its stdout in gpu_NAME.json and its stderr in gpu_NAME.log, and the daemons' logs in
# gpu_odbd_logs.tar.gz: written to $OUT when set (flat, at most 8 files) and to
# bench/results/ (ODB_GPU_RESULTS overrides; on the CPU: $ODB_GPU_WORK/results).
#
# Environment (all optional):
#   PY                  the interpreter (default: the first of python3 on PATH,
#                       /opt/torch/.venv/bin/python3 and /usr/bin/python3 that imports torch)
#   ODB_GPU_RUN_DEVICE  cuda (default) or cpu: cpu runs the same steps with a small model, to
#                       test this script on a machine without a GPU (with small SAMPLES)
#   SAMPLES             demo samples (default 6000 on cuda, 200 on cpu)
#   GLOBAL_BATCH, LOSS_GLOBAL_BATCH  samples per optimizer step of the demo's / loss benchmark's
#                       common recipe (default 32 on cuda, 16 on cpu; 0: the old comparison)
#   ODB_GPU_BENCHES     which benchmarks, space-separated (default: all in BENCHES); none: build
#                       and smoke-test only (no torch needed)
#   ODB_GPU_DEADLINE_S  the whole run's time budget in seconds (default 420): each benchmark's
#                       timeout is cut to what is left, and the files are collected in time
#   ODB_GPU_BUNDLE      the bundle (default .gpu); ODB_GPU_WORK scratch (default /tmp/odb-gpu-run)
#   ODB_GPU_BUILD       pip (only), direct (only) or auto (default: pip, then direct)
#   ODB_GPU_PYBIND11    bundle (default when the bundle has one) or system
#   ODB_BUILD_JOBS      parallel compiles (default: nproc)
#   CXX, CC             the compilers (default: g++, gcc, else c++, cc)
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)

DEVICE=${ODB_GPU_RUN_DEVICE:-cuda}
PY=${PY:-}
BUNDLE=${ODB_GPU_BUNDLE:-$ROOT/.gpu}
WORK=${ODB_GPU_WORK:-/tmp/odb-gpu-run}
BUILD_WORK=$WORK
RESULTS=${ODB_GPU_RESULTS:-$ROOT/bench/results}
if [ "$DEVICE" != cuda ] && [ -z "${ODB_GPU_RESULTS:-}" ]; then RESULTS=$WORK/results; fi   # a test, not figures
JOBS=${ODB_BUILD_JOBS:-$(nproc)}
DEADLINE=${ODB_GPU_DEADLINE_S:-420}
OUT=${OUT:-}
BENCH_LIST=${ODB_GPU_BENCHES:-}
DIR=${OUT:-$RESULTS}   # where the files are written as they are made (copied to RESULTS at the end)
DIR_OUT=$DIR

# Model and data of the demo, per device (environment overrides).
if [ "$DEVICE" = cuda ]; then
  SAMPLES=${SAMPLES:-4000}; MAX_LEN=${MAX_LEN:-1024}; MAX_TOKENS=${MAX_TOKENS:-8192}
  D_MODEL=${D_MODEL:-512}; LAYERS=${LAYERS:-6}; VOCAB=${VOCAB:-4096}; WORKERS=${WORKERS:-2}
  LOSS_SAMPLES=${LOSS_SAMPLES:-3000}; LOSS_MAX_LEN=${LOSS_MAX_LEN:-512}; LOSS_MAX_TOKENS=${LOSS_MAX_TOKENS:-2048}
  LOSS_D_MODEL=${LOSS_D_MODEL:-256}; LOSS_LAYERS=${LOSS_LAYERS:-4}; LOSS_LRS=${LOSS_LRS:-1e-3,3e-3,1e-2}
  LOSS_EVAL_TOKENS=${LOSS_EVAL_TOKENS:-50000}
  GLOBAL_BATCH=${GLOBAL_BATCH:-32}; LOSS_GLOBAL_BATCH=${LOSS_GLOBAL_BATCH:-32}
else
  SAMPLES=${SAMPLES:-200}; MAX_LEN=${MAX_LEN:-128}; MAX_TOKENS=${MAX_TOKENS:-512}
  D_MODEL=${D_MODEL:-32}; LAYERS=${LAYERS:-1}; VOCAB=${VOCAB:-256}; WORKERS=${WORKERS:-1}
  LOSS_SAMPLES=${LOSS_SAMPLES:-200}; LOSS_MAX_LEN=${LOSS_MAX_LEN:-128}; LOSS_MAX_TOKENS=${LOSS_MAX_TOKENS:-512}
  LOSS_D_MODEL=${LOSS_D_MODEL:-32}; LOSS_LAYERS=${LOSS_LAYERS:-1}; LOSS_LRS=${LOSS_LRS:-3e-3,3e-2}
  LOSS_EVAL_TOKENS=${LOSS_EVAL_TOKENS:-5000}
  GLOBAL_BATCH=${GLOBAL_BATCH:-16}; LOSS_GLOBAL_BATCH=${LOSS_GLOBAL_BATCH:-16}
fi
# Both benchmarks compare the same recipe (issue 20): Standard accumulates to GLOBAL_BATCH samples
# per optimizer step, odb runs windows of the same expected loss tokens; 0 gives the old comparison
# (each method's budget sets its optimizer batch).
export DIR_OUT  # where BENCH_loss copies its PNG

# --- The benchmarks ------------------------------------------------------------------------------
# A benchmark NAME is the array BENCH_NAME (its command, run in the repository root with odb
# importable and odbd found: PYTHONPATH, ODB_NATIVE_LIB, ODBD, PATH are set), TIMEOUT_NAME
# (seconds; the deadline cuts it further) and its name in BENCHES, in running order. Its stdout
# goes to gpu_NAME.json, its stderr to gpu_NAME.log. To add one:
#   BENCH_x=("$PY" bench/x.py --device "$DEVICE" ...); TIMEOUT_x=200; BENCHES+=(x)
# At most 8 files come back from $OUT: gpu_run.log, gpu_build.log, gpu_odbd_logs.tar.gz and two
# per benchmark (loss: three, with its PNG), so these two benchmarks fill it.
# shellcheck disable=SC2034  # (used through namerefs in run_bench)
define_benches() {
  BENCH_demo=("$PY" examples/train_demo.py --device "$DEVICE" --world-size 2 --samples "$SAMPLES"
              --max-len "$MAX_LEN" --max-tokens "$MAX_TOKENS" --d-model "$D_MODEL" --layers "$LAYERS"
              --vocab "$VOCAB" --workers "$WORKERS" --global-batch "$GLOBAL_BATCH" --json)
  TIMEOUT_demo=${TIMEOUT_DEMO:-170}
  # Held-out loss against time and tokens at the same recipe, Standard and odb each at its best LR
  # of the grid and both at Standard's (bench/loss_at_time.py; its summary has odb's time-to-target
  # speed-up over its tokens/s ratio): its PNG comes back as gpu_loss.png, its JSON on stdout. No budget
  # grid by default (the 10-minute limit); LOSS_STANDARD_BUDGETS / LOSS_ODB_BUDGETS (comma-separated
  # max_tokens, odb's at least LOSS_MAX_LEN) and LOSS_BUDGET_LRS add one.
  local loss_dir=$WORK/loss
  BENCH_loss=(bash -c 'set -e; py=$0; out=$1; shift; "$py" bench/loss_at_time.py --out "$out" "$@" >&2;
              cp "$out/loss_at_time.png" "$DIR_OUT/gpu_loss.png"; cat "$out/loss_at_time.json"' "$PY" "$loss_dir" --device "$DEVICE" --samples "$LOSS_SAMPLES"
              --epochs 2 --max-len "$LOSS_MAX_LEN" --max-tokens "$LOSS_MAX_TOKENS" --d-model "$LOSS_D_MODEL"
              --layers "$LOSS_LAYERS" --vocab 256 --workers "$WORKERS" --lrs "$LOSS_LRS"
              --eval-every-tokens "$LOSS_EVAL_TOKENS" --timeout 120 --global-batch "$LOSS_GLOBAL_BATCH"
              --standard-budgets "${LOSS_STANDARD_BUDGETS:-}" --odb-budgets "${LOSS_ODB_BUDGETS:-}"
              --budget-lrs "${LOSS_BUDGET_LRS:-$LOSS_LRS}")
  TIMEOUT_loss=${TIMEOUT_LOSS:-260}
  BENCHES=(demo loss)
}

# --- Helpers -------------------------------------------------------------------------------------
die() { echo "bench/gpu_run.sh: FAILED: $*" >&2; exit 1; }
step() { echo; echo "=== [$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
try() { "$@" 2>&1 || echo "($1 failed: $?)"; }   # a diagnostic that may fail

collect() {  # the daemons' logs, and the files into RESULTS (when they were written to $OUT)
  local logs
  logs=$(cd "$WORK/tmp" 2>/dev/null && find . -name 'odbd-*.log' 2>/dev/null | head -200 || true)
  if [ -n "$logs" ]; then
    (cd "$WORK/tmp" && echo "$logs" | tar -czf "$DIR/gpu_odbd_logs.tar.gz" -T -) 2>/dev/null || true
  fi
  if [ -n "$OUT" ] && [ "$OUT" != "$RESULTS" ]; then
    cp -f "$OUT"/gpu_* "$RESULTS"/ 2>/dev/null || true
  fi
}

detect_compilers() {
  if [ -z "${CXX:-}" ]; then
    for c in g++ c++ clang++; do if command -v "$c" >/dev/null; then CXX=$c; break; fi; done
  fi
  [ -n "${CXX:-}" ] && command -v "${CXX%% *}" >/dev/null || die "no C++ compiler: neither g++, c++ nor clang++ is on PATH (CXX=${CXX:-unset}); the odb Python extension must be compiled on this machine for its Python. Install g++ (e.g. apt install g++), or set CXX"
  if [ -z "${CC:-}" ]; then
    for c in gcc cc clang; do if command -v "$c" >/dev/null; then CC=$c; break; fi; done
    CC=${CC:-$CXX}
  fi
  export CC CXX
}

# The extension, compiled with setup.py through pip (static route, everything from the bundle).
build_pip() {
  rm -rf "$BUILD_WORK/py" "$BUILD_WORK/build"
  env ODB_STATIC_DEPS="$BUNDLE/static-deps" ODB_STATIC_REQUIRED=1 ODB_PROTO_GENERATED="$BUNDLE/proto" \
      ODB_BUILD_DIR="$BUILD_WORK/build" ODB_BUILD_JOBS="$JOBS" CPLUS_INCLUDE_PATH="$INCLUDES" \
      PYTHONPATH="$PYBIND11_PATH${PYTHONPATH:+:$PYTHONPATH}" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
      "$PY" -m pip install -v --no-build-isolation --no-deps --no-index --target "$BUILD_WORK/py" ./client/python \
      >> "$DIR/gpu_build.log" 2>&1 || return 1
  EXT=$(ls "$BUILD_WORK"/py/odb/_odb_native*.so 2>/dev/null | head -1)
  [ -n "$EXT" ]
}

# The same, without pip and setuptools: setup.py's sources and flags, compiled with $CXX.
build_direct() {
  local d=$BUILD_WORK/direct pyinc pybind suffix src obj objs=() pids=() i
  rm -rf "$d"; mkdir -p "$d/gen/proto" "$d/obj"
  cp "$BUNDLE"/proto/gen-lite/proto/odb.pb.{h,cc} "$d/gen/proto/"
  pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  pybind=$(PYTHONPATH="$PYBIND11_PATH${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import pybind11; print(pybind11.get_include())') \
    || { echo "pybind11 is not importable" >> "$DIR/gpu_build.log"; return 1; }
  suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX") or ".so")')
  mapfile -t sources < <("$PY" - "$ROOT/client/python/setup.py" <<'EOF'
import ast, sys
for node in ast.parse(open(sys.argv[1]).read()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CXX_SOURCES" for t in node.targets):
        print("\n".join(ast.literal_eval(node.value)))
EOF
)
  [ "${#sources[@]}" -gt 0 ] || { echo "no CXX_SOURCES in setup.py" >> "$DIR/gpu_build.log"; return 1; }
  local flags=(-std=c++20 -O2 -g0 -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -Wno-unused-parameter
               -I"$d/gen" -I"$ROOT" -I"$ROOT/client/cpp/include" -I"$pybind" -I"$pyinc")
  i=0
  for src in "${sources[@]/#/$ROOT/}" "$d/gen/proto/odb.pb.cc"; do
    obj="$d/obj/$i.o"; i=$((i + 1)); objs+=("$obj")
    echo "+ $CXX -c $src" >> "$DIR/gpu_build.log"
    CPLUS_INCLUDE_PATH="$INCLUDES" "$CXX" "${flags[@]}" -c "$src" -o "$obj" >> "$DIR/gpu_build.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  [ "$failed" = 0 ] || return 1
  local s=$BUNDLE/static-deps/lib
  EXT=$d/_odb_native$suffix
  "$CXX" -shared -o "$EXT" "${objs[@]}" -Wl,--exclude-libs,ALL -Wl,--as-needed "$s/libzmq.a" \
    "$s/libprotobuf-lite.a" -Wl,--start-group "$s"/libabsl_*.a -Wl,--end-group -lpthread -lrt \
    >> "$DIR/gpu_build.log" 2>&1 || return 1
}

run_bench() {  # NAME
  local name=$1 t rc
  local -n cmd="BENCH_$name"
  local -n limit="TIMEOUT_$name"
  t=$(( $(left) - 25 ))
  [ "$t" -le "${limit:-300}" ] || t=${limit:-300}
  if [ "$t" -lt 20 ]; then
    echo "SKIPPED $name: only $(left)s left of the ${DEADLINE}s deadline"
    return 1
  fi
  step "benchmark $name (timeout ${t}s): ${cmd[*]}"
  set +e
  timeout -k 15 "$t" "${cmd[@]}" > "$DIR/gpu_$name.json" 2> "$DIR/gpu_$name.log"
  rc=$?
  set -e
  tail -n 40 "$DIR/gpu_$name.log" | tr '\r' '\n' | tail -n 25
  echo "--- gpu_$name.json:"
  cat "$DIR/gpu_$name.json"
  case $rc in
    0) echo "benchmark $name: done in $(( $(date +%s) - START ))s of the run" ;;
    124|137) echo "benchmark $name: TIMED OUT after ${t}s (raise ODB_GPU_DEADLINE_S / TIMEOUT_$name or lower SAMPLES)"; return 1 ;;
    *) echo "benchmark $name: FAILED with exit code $rc (see gpu_$name.log)"; return 1 ;;
  esac
}

main() {
  set -euo pipefail   # (main runs in the pipeline's subshell, after the `set +e` below)
  trap collect EXIT
  rm -rf "$WORK/tmp"; mkdir -p "$WORK/tmp"
  # The extension is loaded from $WORK: it must be on a file system that allows exec.
  printf '#!/bin/sh\nexit 0\n' > "$WORK/exec-probe"; chmod +x "$WORK/exec-probe"
  if ! "$WORK/exec-probe" 2>/dev/null; then
    echo "$WORK does not allow exec (noexec mount): using $ROOT/.gpu-work for the build"
    BUILD_WORK=$ROOT/.gpu-work
  fi
  mkdir -p "$BUILD_WORK"
  : > "$DIR/gpu_build.log"

  step "machine"
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "host $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null || echo '?'), $(nproc) CPUs, user $(id -un 2>/dev/null || id -u)"
  (. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") || true
  echo "glibc $(ldd --version 2>&1 | awk 'NR==1{print $NF}'), kernel $(uname -r)"
  try free -g | head -2
  echo "device: $DEVICE; deadline ${DEADLINE}s; work $WORK; files to $DIR${OUT:+ (and $RESULTS)}"
  if [ "$DEVICE" = cuda ]; then
    try nvidia-smi -L
    try nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,utilization.gpu --format=csv
  fi

  step "python"
  if [ -z "$PY" ]; then
    local c
    for c in "$(command -v python3 || true)" /opt/torch/.venv/bin/python3 /usr/bin/python3; do
      [ -n "$c" ] && [ -x "$c" ] || continue
      [ -n "$PY" ] || PY=$c   # the first one, if none imports torch
      if "$c" -c "import torch" >/dev/null 2>&1; then PY=$c; break; fi
    done
  fi
  [ -n "$PY" ] && [ -x "$(command -v "$PY")" ] || die "no python3 found (set PY)"
  "$PY" - <<'EOF' || die "$PY cannot report its versions"
import importlib, sys, sysconfig
print("python", sys.version.split()[0], sys.executable, "include", sysconfig.get_paths()["include"])
for name in ("torch", "numpy", "pybind11", "setuptools", "wheel", "pip"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}")
    except Exception as e:  # reported, not fatal here
        print(f"  {name}: not importable ({type(e).__name__}: {e})")
try:
    import torch
    print("  torch cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          "devices", torch.cuda.device_count(),
          [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
except Exception as e:
    print("  torch cuda: ?", e)
EOF
  if [ "$BENCH_LIST" = none ]; then
    echo "ODB_GPU_BENCHES=none: building and smoke-testing only (torch not needed)"
  elif ! "$PY" -c "import torch" 2>/dev/null; then
    die "$PY cannot import torch (the benchmarks need it)"
  elif [ "$DEVICE" = cuda ]; then
    "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
      || die "$PY's torch sees no CUDA device (torch.cuda.is_available() is False); ODB_GPU_RUN_DEVICE=cpu runs on the CPU"
  fi

  step "compiler"
  detect_compilers
  echo "CXX=$CXX: $("$CXX" --version | head -1)"
  echo "CC=$CC: $("$CC" --version 2>/dev/null | head -1)"
  echo "ld: $(ld --version 2>/dev/null | head -1 || echo '?')"

  step "bundle $BUNDLE"
  [ -f "$BUNDLE/MANIFEST" ] || die "no bundle at $BUNDLE: run bench/gpu_bundle.sh on the development machine and carry .gpu"
  cat "$BUNDLE/MANIFEST"
  for f in bin/odbd libexec/odbd static-deps/.odb-complete static-deps/lib/libzmq.a include/zmq.h \
           include/google/protobuf/message_lite.h include/absl/status/status.h proto/gen-lite/proto/odb.pb.cc; do
    [ -e "$BUNDLE/$f" ] || die "the bundle lacks $f: make it again (bench/gpu_bundle.sh)"
  done
  cmp -s "$BUNDLE/proto/odb.proto" proto/odb.proto \
    || die "proto/odb.proto changed since the bundle was made: run bench/gpu_bundle.sh again"

  step "odbd"
  for f in bin/odbd libexec/odbd; do   # (in case the copy lost the exec bits)
    [ -x "$BUNDLE/$f" ] || chmod +x "$BUNDLE/$f" || die "$BUNDLE/$f is not executable"
  done
  if ! "$BUNDLE/bin/odbd" --help > "$WORK/odbd-help.txt" 2>&1; then
    cat "$WORK/odbd-help.txt"
    if grep -q -e GLIBCXX -e CXXABI -e 'libstdc++' -e libgcc_s "$WORK/odbd-help.txt"; then
      echo "this machine's libstdc++ is older than odbd's: using the bundle's (lib-gcc)"
      export ODB_GPU_OWN_LIBSTDCXX=1
      "$BUNDLE/bin/odbd" --help > "$WORK/odbd-help.txt" 2>&1 || { cat "$WORK/odbd-help.txt"; die "odbd does not start"; }
    else
      LD_LIBRARY_PATH="$BUNDLE/lib" ldd "$BUNDLE/libexec/odbd" || true
      die "odbd does not start (see above)"
    fi
  fi
  echo "$BUNDLE/bin/odbd --help: ok$( [ "${ODB_GPU_OWN_LIBSTDCXX:-0}" = 1 ] && echo ' (with the bundled libstdc++)')"
  LD_LIBRARY_PATH="$BUNDLE/lib" ldd "$BUNDLE/libexec/odbd" | awk -v b="$BUNDLE/lib/" 'index($3, b) != 1' || true
  echo "(and $(ls "$BUNDLE/lib" | wc -l) libraries from $BUNDLE/lib)"

  step "python extension (for $("$PY" -c 'import sys; print(sys.version.split()[0])'), -j$JOBS)"
  local pyinc pyver
  pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  INCLUDES=$BUNDLE/include
  if [ -f "$pyinc/Python.h" ]; then
    echo "Python.h: $pyinc"
  elif [ -f "$BUNDLE/python-include/python$pyver/Python.h" ]; then
    echo "Python.h: not in $pyinc; using the bundle's python$pyver headers"
    INCLUDES=$INCLUDES:$BUNDLE/python-include/python$pyver
  else
    die "$PY has no Python.h ($pyinc) and the bundle has no python$pyver headers: install python$pyver-dev (or run bench/gpu_bundle.sh with PY312_INCLUDE for that version)"
  fi
  PYBIND11_PATH=""
  if [ "${ODB_GPU_PYBIND11:-bundle}" = bundle ] && [ -f "$BUNDLE/pybind11/pybind11/__init__.py" ]; then
    PYBIND11_PATH=$BUNDLE/pybind11
  fi
  echo "pybind11: $(PYTHONPATH="$PYBIND11_PATH${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import pybind11; print(pybind11.__version__, pybind11.get_include())' 2>&1 | tail -1)"
  EXT=""
  local how=${ODB_GPU_BUILD:-auto} t0
  t0=$(date +%s)
  if [ "$how" != direct ]; then
    echo "pip install --no-build-isolation --target $BUILD_WORK/py ./client/python (static route; log gpu_build.log)"
    if build_pip; then
      echo "built with pip in $(( $(date +%s) - t0 ))s"
    else
      echo "pip build FAILED; its log ends with:"; tail -n 25 "$DIR/gpu_build.log"
      [ "$how" = auto ] || die "the pip build failed (ODB_GPU_BUILD=pip)"
      EXT=""
    fi
  fi
  if [ -z "$EXT" ]; then
    echo "direct build with $CXX (log gpu_build.log)"
    t0=$(date +%s)
    build_direct || { tail -n 60 "$DIR/gpu_build.log"; die "the extension did not build (pip and direct): see gpu_build.log"; }
    echo "built directly in $(( $(date +%s) - t0 ))s"
  fi
  echo "extension: $EXT"
  ldd "$EXT" || true
  if ldd "$EXT" | grep -E 'libzmq|libprotobuf|libabsl|not found'; then
    die "the extension links shared libraries this machine does not have (above)"
  fi

  # What every command below runs with.
  export ODBD=$BUNDLE/bin/odbd ODB_NATIVE_LIB=$EXT PATH=$BUNDLE/bin:$PATH
  export PYTHONPATH=$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}
  export TMPDIR=$WORK/tmp   # the demos' run folders (odbd logs) land here

  step "smoke test: odb without torch, 2 daemons (odbctl demo)"
  "$PY" -c "import odb; from odb._native import native; print('odb', odb.__file__, '| native', native().__file__, '| odbd', odb.find_odbd())" \
    || die "odb does not import with the built extension"
  timeout -k 5 90 "$PY" -m odb.cli demo --plain --ranks 2 --samples 200 --delay 0 \
    || die "odbctl demo failed: odbd and the extension do not work together (see above)"
  define_benches
  if [ "$BENCH_LIST" = none ]; then
    BENCHES=()
  else
    "$PY" -c "import torch, odb; odb.OdbDataLoader; print('odb.OdbDataLoader with torch', torch.__version__)" \
      || die "odb's torch loader does not import"
    if [ -n "$BENCH_LIST" ]; then read -r -a BENCHES <<< "$BENCH_LIST"; fi
  fi
  local failed=() name
  for name in "${BENCHES[@]}"; do
    declare -p "BENCH_$name" >/dev/null 2>&1 || die "no benchmark '$name' (BENCH_$name) in bench/gpu_run.sh"
    run_bench "$name" || failed+=("$name")
  done

  step "end"
  [ "$DEVICE" = cuda ] && try nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "bench/gpu_run.sh: FAILED benchmarks: ${failed[*]} (total $(( $(date +%s) - START ))s)"
    return 1
  fi
  echo "bench/gpu_run.sh: all done in $(( $(date +%s) - START ))s: ${BENCHES[*]:-no benchmark}; files in $DIR"
}

mkdir -p "$RESULTS" ${OUT:+"$OUT"} || { echo "bench/gpu_run.sh: cannot create $RESULTS ${OUT}" >&2; exit 1; }
set +e
main "$@" 2>&1 | tee "$DIR/gpu_run.log"
rc=${PIPESTATUS[0]}
if [ -n "$OUT" ] && [ "$OUT" != "$RESULTS" ]; then cp -f "$OUT/gpu_run.log" "$RESULTS/" 2>/dev/null; fi
exit "$rc"
