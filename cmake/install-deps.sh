#!/usr/bin/env bash
# Install ringattn's build and test dependencies on Debian/Ubuntu when any is missing.
# Idempotent: when everything is present it only checks and prints nothing to install.
# Usage: bash cmake/install-deps.sh
set -euo pipefail

packages=(cmake g++ make pkg-config libopenblas-dev libopenmpi-dev openmpi-bin catch2)
# A command every package provides, so a tool installed outside apt also counts as present.
declare -A commands=([cmake]=cmake [g++]=g++ [make]=make [pkg-config]=pkg-config [openmpi-bin]=mpirun)

missing=()
for pkg in "${packages[@]}"; do
    if dpkg -s "$pkg" >/dev/null 2>&1; then
        continue
    fi
    cmd="${commands[$pkg]:-}"
    if [[ -n "$cmd" ]] && command -v "$cmd" >/dev/null 2>&1; then
        continue
    fi
    missing+=("$pkg")
done

# The Python tests' virtual environment (cmake/python-env.sh) needs a python3 with venv and
# ensurepip: any python3 on the PATH that has them counts.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=(python3 python3-venv)
fi

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

echo "install-deps: missing: ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "install-deps: not root and no sudo; install as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: no apt-get on this system; install the equivalents of: ${missing[*]}" >&2
    exit 1
fi
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
