#!/usr/bin/env bash
# bench/gpu_bundle.sh: run HERE (the Debian 12 development machine) before a GPU run.
#
# Collects into one git-ignored folder (default .gpu/, ODB_GPU_BUNDLE overrides) all
# that bench/gpu_run.sh needs on a GPU machine that has Python, torch and a C++
# compiler but no network, no Bazel, no libzmq, no C++ protobuf, no protoc:
#
#   bin/odbd           wrapper: runs libexec/odbd with LD_LIBRARY_PATH=lib (only odbd
#                      sees these libraries; the trainers' torch never does)
#   libexec/odbd       the daemon (.build/src/daemon/odbd from ./scripts/build.sh), stripped
#   lib/               every shared library odbd needs beyond glibc and the GCC runtime
#                      (ldd's closure: zmq, protobuf, abseil, gloo, yaml-cpp, spdlog, ...)
#   lib-gcc/           our libstdc++/libgcc_s: used only if the machine's are older than
#                      what odbd needs (ODB_GPU_OWN_LIBSTDCXX=1; gpu_run.sh decides)
#   static-deps/       position-independent libzmq.a, libprotobuf-lite.a, libabsl_*.a
#                      (setup.py's ODB_STATIC_DEPS; from .build/static-deps, built if missing)
#   include/           the headers matching those archives: zmq.h, zmq.hpp (cppzmq),
#                      google/protobuf/, absl/ (from the installed Debian -dev packages)
#   proto/             protoc's lite code for proto/odb.proto (setup.py's ODB_PROTO_GENERATED)
#   pybind11/          a pybind11 >= 2.12 (numpy 2, Python 3.12) importable with PYTHONPATH,
#                      when one is found here (PYBIND11_SRC, see below); else gpu_run.sh
#                      uses the machine's own
#   python-include/    Python 3.12 headers (pyenv's), used there only if that interpreter
#                      has no Python.h of its own
#   MANIFEST           what was bundled, from which versions
#
# The Python extension is NOT built here: it is compiled there, for that interpreter
# (bench/gpu_run.sh), from the sources in the working tree and the files above.
#
# Prints the `carry` list for the remote runner at the end (just ".gpu").
#
# Environment: ODB_GPU_BUNDLE (output folder), PYBIND11_SRC (a pybind11 source tree
# or git directory; default: the first of /work/.mirror/pybind+pybind11/repo and a
# pybind11 >= 2.12 importable by `python3`), PYBIND11_REF (git ref in a git
# directory, default v3.1.0), PY312_INCLUDE (a python3.12 include folder; default
# pyenv's).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=${ODB_GPU_BUNDLE:-$ROOT/.gpu}
die() { echo "bench/gpu_bundle.sh: $*" >&2; exit 1; }
say() { echo "gpu_bundle: $*" >&2; }

# Libraries every Linux with glibc and a C++ runtime has (never bundled in lib/).
is_system_lib() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
  esac
  return 1
}

ODBD_BUILT=$ROOT/.build/src/daemon/odbd
if [ ! -x "$ODBD_BUILT" ]; then
  say "$ODBD_BUILT is missing: running ./scripts/build.sh"
  ./scripts/build.sh
fi
[ -x "$ODBD_BUILT" ] || die "$ODBD_BUILT is still missing after ./scripts/build.sh"
newer=$(find src proto client/cpp -newer "$ODBD_BUILT" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.proto' \) 2>/dev/null | head -5)
if [ -n "$newer" ]; then
  say "WARNING: sources changed after $ODBD_BUILT was built ($(echo $newer)...): the bundled odbd and the"
  say "         extension compiled there from these sources may disagree; run ./scripts/build.sh first"
fi
for tool in ldd strip protoc dpkg-query; do
  command -v "$tool" >/dev/null || die "$tool is missing here"
done

rm -rf "$B"
mkdir -p "$B"/{bin,libexec,lib,lib-gcc,static-deps/lib,include,proto/gen-lite/proto}

# --- odbd and its shared libraries ---------------------------------------------------------
cp "$ODBD_BUILT" "$B/libexec/odbd"
chmod u+w "$B/libexec/odbd"
strip --strip-unneeded "$B/libexec/odbd"
while read -r soname arrow path _; do
  [ "$arrow" = "=>" ] || continue
  [ "$path" != "not" ] || die "odbd needs $soname, which is not installed here"
  if is_system_lib "$soname"; then
    case "$soname" in libstdc++.so*|libgcc_s.so*) cp -L "$path" "$B/lib-gcc/$soname" ;; esac
    continue
  fi
  cp -L "$path" "$B/lib/$soname"   # the real file under its soname
done < <(ldd "$ODBD_BUILT")
chmod -R u+w "$B/lib" "$B/lib-gcc"
strip --strip-unneeded "$B"/lib/*.so* "$B"/lib-gcc/*.so* 2>/dev/null || true
cat > "$B/bin/odbd" <<'EOF'
#!/bin/sh
# odbd with its bundled libraries (bench/gpu_bundle.sh); only this process sees them.
here=$(dirname "$(readlink -f "$0")")/..
libs="$here/lib"
if [ "${ODB_GPU_OWN_LIBSTDCXX:-0}" = 1 ]; then libs="$libs:$here/lib-gcc"; fi
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/libexec/odbd" "$@"
EOF
chmod 755 "$B/bin/odbd"
# Every library outside glibc/the GCC runtime must now resolve inside the bundle.
outside=$(LD_LIBRARY_PATH="$B/lib" ldd "$B/libexec/odbd" | awk -v lib="$B/lib/" '
  $2 == "=>" && $3 == "not" { print; next }
  $2 == "=>" && index($3, lib) != 1 && $1 !~ /^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libresolv\.so|libutil\.so|libstdc\+\+\.so|libgcc_s\.so)/ { print }')
[ -z "$outside" ] || die "odbd still resolves libraries outside $B/lib:"$'\n'"$outside"
env -i "$B/bin/odbd" --help >/dev/null || die "$B/bin/odbd --help fails in an empty environment"

# --- static archives for the extension (setup.py's ODB_STATIC_DEPS) ---------------------------
STATIC=$ROOT/.build/static-deps
if [ ! -f "$STATIC/.odb-complete" ]; then
  say "$STATIC is not built: building it with setup.py's static route (apt-get source, cmake; minutes)"
  tmp=$(mktemp -d /tmp/odb-gpu-bundle.XXXXXX)
  ODB_STATIC_DEPS=$STATIC ODB_STATIC_REQUIRED=1 ODB_BUILD_DIR=$tmp/build PIP_NO_INDEX=1 \
    /usr/bin/python3 -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/wheel" ./client/python \
    || die "building $STATIC failed (see above)"
  rm -rf "$tmp"
fi
cp "$STATIC/.odb-complete" "$B/static-deps/"
cp "$STATIC"/lib/libzmq.a "$STATIC"/lib/libprotobuf-lite.a "$STATIC"/lib/libabsl_*.a "$B/static-deps/lib/"

# --- the headers of those archives (the installed Debian -dev packages they were rebuilt from) ----
for h in zmq.h zmq_utils.h zmq.hpp zmq_addon.hpp; do
  [ -f "/usr/include/$h" ] || die "/usr/include/$h is missing (scripts/install_deps.sh)"
  cp "/usr/include/$h" "$B/include/"
done
mkdir -p "$B/include/google"
cp -r /usr/include/google/protobuf "$B/include/google/"
rm -rf "$B/include/google/protobuf/compiler"   # protoc's plugin API: not used by generated code
cp -r /usr/include/absl "$B/include/"

# --- protoc's lite code (setup.py's ODB_PROTO_GENERATED) ---------------------------------------
protoc_version=$(protoc --version | awk '{print $2}')
protobuf_dev=$(dpkg-query -W -f '${Version}' libprotobuf-dev)
case "$protobuf_dev" in "$protoc_version"-*|"$protoc_version") ;;
  *) die "protoc $protoc_version does not match libprotobuf-dev $protobuf_dev" ;; esac
protoc --proto_path=proto --cpp_out=lite:"$B/proto/gen-lite/proto" proto/odb.proto
cp proto/odb.proto "$B/proto/odb.proto"

# --- pybind11 >= 2.12 (numpy 2 and Python 3.12 support) -----------------------------------------
pybind11_version=""
src=${PYBIND11_SRC:-}
if [ -z "$src" ] && [ -d /work/.mirror/pybind+pybind11/repo ]; then src=/work/.mirror/pybind+pybind11/repo; fi
if [ -z "$src" ]; then
  src=$(python3 -c 'import os, pybind11; print(os.path.dirname(pybind11.__file__))' 2>/dev/null || true)
fi
if [ -n "$src" ]; then
  mkdir -p "$B/pybind11"
  if git --git-dir="$src" rev-parse --verify -q "${PYBIND11_REF:-v3.1.0}^{commit}" >/dev/null 2>&1; then
    git --git-dir="$src" archive "${PYBIND11_REF:-v3.1.0}" pybind11 include | tar -x -C "$B/pybind11"
  elif [ -f "$src/pybind11/__init__.py" ] && [ -d "$src/include/pybind11" ]; then   # a source tree
    cp -r "$src/pybind11" "$src/include" "$B/pybind11/"
  elif [ -f "$src/__init__.py" ] && [ -d "$src/include/pybind11" ]; then            # an installed package
    cp -r "$src" "$B/pybind11/pybind11"
  else
    say "WARNING: $src is no pybind11 source tree, git directory or package: not bundling pybind11"
  fi
  rm -rf "$B/pybind11/pybind11/__pycache__"
  if [ -f "$B/pybind11/pybind11/__init__.py" ]; then
    pybind11_version=$(PYTHONPATH="$B/pybind11" /usr/bin/python3 -c 'import pybind11; print(pybind11.__version__)')
    if ! PYTHONPATH="$B/pybind11" /usr/bin/python3 -c 'import sys, pybind11
sys.exit(0 if tuple(int(x) for x in pybind11.__version__.split(".")[:2]) >= (2, 12) else 1)'; then
      say "WARNING: pybind11 $pybind11_version is older than 2.12 (numpy 2): not bundled"
      rm -rf "$B/pybind11"; pybind11_version=""
    fi
  fi
fi
[ -n "$pybind11_version" ] || { rm -rf "$B/pybind11"; say "WARNING: no pybind11 bundled: gpu_run.sh will use the GPU machine's"; }

# --- Python 3.12 headers, for an interpreter there without its own ------------------------------
py312=${PY312_INCLUDE:-}
if [ -z "$py312" ]; then
  py312=$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/include/python3.12 2>/dev/null | sort -V | tail -1 || true)
fi
if [ -n "$py312" ] && [ -f "$py312/Python.h" ]; then
  mkdir -p "$B/python-include"
  cp -r "$py312" "$B/python-include/python3.12"
  py312_version=$(awk '/#define PY_VERSION /{gsub(/"/, "", $3); print $3}' "$py312/patchlevel.h")
else
  say "WARNING: no Python 3.12 headers found here (PY312_INCLUDE): the GPU machine's interpreter must have its own"
  py312_version=none
fi

# --- MANIFEST ------------------------------------------------------------------------------------
{
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | awk 'NR==1{print $NF}')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src proto client 2>/dev/null || echo ' (with local changes in src/proto/client)')"
  echo "odbd: .build/src/daemon/odbd of $(date -u -r "$ODBD_BUILT" +%Y-%m-%dT%H:%M:%SZ)"
  echo "lib: $(ls "$B/lib" | tr '\n' ' ')"
  for p in libzmq3-dev libprotobuf-dev libabsl-dev; do echo "$p: $(dpkg-query -W -f '${Version}' "$p")"; done
  echo "protoc: $protoc_version (lite code for proto/odb.proto, sha256 $(sha256sum proto/odb.proto | cut -c1-16))"
  echo "pybind11: ${pybind11_version:-none, the GPU machine has its own}"
  echo "python-include: $py312_version"
  echo "g++ here: $(g++ --version | head -1)"
} > "$B/MANIFEST"

size=$(du -sm "$B" | cut -f1)
cat "$B/MANIFEST" >&2
say "bundle $B: ${size} MiB ($(find "$B" -type f | wc -l) files)"
[ "$size" -lt 40 ] || die "the bundle is ${size} MiB: over the 40 MiB meant for it"
git check-ignore -q "$B" 2>/dev/null || say "WARNING: $B is not ignored by git: it would travel as untracked files, not as a carried path"
rel=${B#"$ROOT"/}
echo "carry: [\"$rel\"]"
echo "command: bash bench/gpu_run.sh"
