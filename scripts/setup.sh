#!/usr/bin/env bash
# Installs what duet needs to build and test, from Debian's packages, when it is missing.
# Safe to run repeatedly; needs root (or sudo) only when something has to be installed.
set -euo pipefail
packages=(build-essential cmake ninja-build ccache libdnnl-dev libstb-dev libgtest-dev libgmock-dev
          libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev python3
          python3-matplotlib)  # matplotlib: the test of scripts/plot_profile.py
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present"
