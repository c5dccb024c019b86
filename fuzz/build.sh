#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 (-fsanitize=fuzzer,address,undefined).
# Bazel 4 is pinned to gcc here, so this calls clang++ directly; the same
# fuzz target sources are also built by Bazel (gcc) as //fuzz:regression_test,
# which replays fuzz/corpus and fuzz/regressions on every test run.
#
#   fuzz/build.sh            # all targets -> $OUT (default /tmp/odb-fuzz)
#   fuzz/build.sh --seeds    # ... and regenerate the generated seeds under fuzz/corpus/
#   $OUT/decoder_fuzzer fuzz/corpus/decoder -runs=10000000   (see docs/fuzzing.md)
#
# Needs: clang-14, libfuzzer-14-dev, libclang-rt-14-dev, protobuf-compiler and
# the libraries third_party/BUILD links (scripts/install_deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/odb-fuzz}"
CXX="${CXX:-clang++-14}"
mkdir -p "$OUT/obj" "$OUT/gen/proto"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CXXFLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -I. -Iclient/cpp/include -I"$OUT/gen" -DSPDLOG_FMT_EXTERNAL
          -DSPDLOG_SHARED_LIB $SAN)
ABSL=(-labsl_statusor -labsl_status -labsl_cord -labsl_cordz_info -labsl_cord_internal
      -labsl_cordz_functions -labsl_cordz_handle -labsl_exponential_biased -labsl_synchronization
      -labsl_graphcycles_internal -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal
      -labsl_demangle_internal -labsl_malloc_internal -labsl_time -labsl_civil_time
      -labsl_time_zone -labsl_str_format_internal -labsl_strings -labsl_strings_internal
      -labsl_int128 -labsl_throw_delegate -labsl_raw_logging_internal -labsl_base
      -labsl_spinlock_wait -labsl_log_severity)
LIBS=(-lprotobuf -lzmq -lyaml-cpp -lspdlog -lfmt "${ABSL[@]}" -lpthread)

# Protobuf C++ code from the system protoc (as //proto:odb_proto_gen does).
if [ ! -f "$OUT/gen/proto/odb.pb.cc" ] || [ proto/odb.proto -nt "$OUT/gen/proto/odb.pb.cc" ]; then
  protoc --proto_path=proto --cpp_out="$OUT/gen/proto" proto/odb.proto
fi
if [ ! -f "$OUT/gen/proto/peer.pb.cc" ] || [ proto/peer.proto -nt "$OUT/gen/proto/peer.pb.cc" ]; then
  protoc --proto_path=proto --cpp_out="$OUT/gen/proto" proto/peer.proto
fi

# Library sources, compiled once with the sanitizers and fuzzer coverage.
obj() {  # obj SRC -> prints the object path, compiling it when stale
  local src="$1" o="$OUT/obj/$(echo "$1" | tr / _).o"
  if [ ! -f "$o" ] || [ "$src" -nt "$o" ] || [ -n "$(find "$(dirname "$src")" fuzz/fuzz_util.h -newer "$o" -name '*.h' 2>/dev/null | head -1)" ]; then
    "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$o" >&2
  fi
  echo "$o"
}
PROTO="$(obj "$OUT/gen/proto/odb.pb.cc")"
COMMON=("$PROTO" "$(obj src/common/dtype.cc)" "$(obj src/wire/tensor_codec.cc)")

# The shared-memory arenas (real memfds) under the arena targets.
SHM="src/shm/arena.cc src/shm/arena_reader.cc src/shm/arena_writer.cc src/shm/completion_queue.cc \
src/shm/slot_allocator.cc src/shm/process.cc src/shm/fd_passing.cc"
# The messages between daemons (proto/peer.proto) and their one reader.
PEER="$OUT/gen/proto/peer.pb.cc src/align/peer_wire.cc"
declare -A TARGET_SRCS=(
  [decoder]="src/ingest/decoder.cc"
  [meta_codec]="src/align/meta_codec.cc $PEER"
  [hello]="src/align/hello.cc $PEER src/align/planner.cc src/align/planned_groups.cc src/align/window.cc src/grouping/budget.cc src/grouping/grouper.cc"
  [config]="src/daemon/config.cc src/grouping/budget.cc src/collate/collator.cc src/common/buffer_pool.cc"
  [delivery_decoder]="client/cpp/src/delivery_decoder.cc"
  [arena_block]="src/ingest/decoder.cc src/ingest/arena_registry.cc $SHM"
  [arena_register]="src/ingest/decoder.cc src/ingest/arena_registry.cc $SHM"
  [step_arena]="client/cpp/src/delivery_decoder.cc src/emit/step_arena.cc src/emit/step_encoder.cc src/common/buffer_pool.cc $SHM"
)
targets=(decoder meta_codec hello config arena_block arena_register step_arena)
if [ -n "${FUZZ_TARGETS:-}" ]; then read -r -a targets <<< "$FUZZ_TARGETS"; fi  # e.g. FUZZ_TARGETS="arena_block step_arena"
if [ -z "${FUZZ_TARGETS:-}" ] && [ -f client/cpp/src/delivery_decoder.cc ]; then targets+=(delivery_decoder); fi

for t in "${targets[@]}"; do
  objs=()
  for s in ${TARGET_SRCS[$t]}; do objs+=("$(obj "$s")"); done
  "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer "fuzz/${t}_fuzzer.cc" "${objs[@]}" "${COMMON[@]}" \
    "${LIBS[@]}" -o "$OUT/${t}_fuzzer"
  echo "built $OUT/${t}_fuzzer"
done

if [ "${1:-}" = "--seeds" ]; then
  seed_objs=()
  for s in src/align/meta_codec.cc src/align/hello.cc $PEER src/align/planner.cc src/align/planned_groups.cc src/align/window.cc src/grouping/budget.cc src/grouping/grouper.cc; do
    seed_objs+=("$(obj "$s")")
  done
  "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link fuzz/seed_gen.cc "${seed_objs[@]}" "${COMMON[@]}" \
    "${LIBS[@]}" -o "$OUT/seed_gen"
  "$OUT/seed_gen" fuzz/corpus
fi
