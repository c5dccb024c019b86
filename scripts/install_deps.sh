#!/usr/bin/env bash
# Installs every Debian package the build, the tests, the demo and the benchmarks need.
# Idempotent: returns quickly when everything is already installed.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java bazel-platforms
  g++ libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler
  libgloo-dev libspdlog-dev libfmt-dev libyaml-cpp-dev catch2 libabsl-dev libcli11-dev
  libhiredis-dev nlohmann-json3-dev
  python3 python3-dev python3-pybind11 pybind11-dev python3-torch python3-zmq python3-protobuf
  python3-numpy python3-matplotlib python3-pytest python3-mypy python3-yaml python3-prometheus-client
  python3-setuptools python3-wheel python3-venv python3-pip
  libcpp-httplib-dev clang-14 libfuzzer-14-dev libclang-rt-14-dev
  spin redis-server iproute2 procps systemd
  patchelf  # client/python/setup.py: the odbd it bundles finds odb/.libs through its RPATH
  coinor-cbc glpk-utils  # bench/exchange_optimum.py and its test: the exact minimum of inter-node bytes
  espeak-ng python3-pil adwaita-icon-theme  # examples/multimodal_data.py: speech, decoded icons (8-512 px PNGs)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# tests/integration/test_deploy.py renders the Kubernetes manifests with `kubectl kustomize`:
# Debian's kubernetes-client, unless a kubectl is installed already (it would own /usr/bin/kubectl).
if ! command -v kubectl >/dev/null 2>&1; then
  missing+=(kubernetes-client)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "[install_deps] installing: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
