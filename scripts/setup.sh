#!/usr/bin/env bash
# Installs what duet needs to build and test, from Debian's packages, when it is missing.
# Safe to run repeatedly; needs root (or sudo) only when something has to be installed.
# With --fuzz also clang and its libFuzzer runtime, for scripts/fuzz.sh (CI's fuzzing block).
set -euo pipefail
packages=(build-essential cmake ninja-build ccache libdnnl-dev libstb-dev libjpeg-dev libpng-dev libgtest-dev libgmock-dev
          libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev python3
          libonnx-dev  # ONNX export (duet export --onnx): onnx's protobuf classes and checker
          python3-matplotlib  # matplotlib: the test of scripts/plot_profile.py
          protobuf-compiler libprotobuf-dev  # protoc and its runtime: TensorBoard event files, ONNX
          libisal-dev  # ISA-L's CRC32C: TensorBoard event records
          iproute2  # ip netns: the tests' several hosts on one machine (scripts/hosts.sh)
          openmpi-bin libopenmpi-dev)  # MPI: data-parallel training across processes (optional to the build)
if [ "${1:-}" = "--fuzz" ]; then packages+=(clang libclang-rt-14-dev); fi  # Debian 12's clang is clang 14
source "$(dirname "$0")/apt_install_missing.sh"
apt_install_missing setup "${packages[@]}"
echo "setup: dependencies present"
