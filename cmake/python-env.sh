#!/usr/bin/env bash
# Makes (once) the virtual environment the Python tests run in and installs this checkout's
# package into it; prints the environment's python on its last line.
#   bash cmake/python-env.sh
# The environment lives outside the checkout ($RINGATTN_VENV, default
# ${XDG_CACHE_HOME:-$HOME/.cache}/ringattn/venv) and is reused while python/requirements-test.txt
# is unchanged: torch alone brings about 3 GB of wheels, too much to fetch for every clean clone.
# The package itself (pip install ./python, which builds libringattn with the project's CMake)
# is reinstalled every time, so the tests always run this checkout's code.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RINGATTN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ringattn/venv}"
reqs="$root/python/requirements-test.txt"
stamp="$venv/.ringattn-requirements"

python="$(command -v python3 || true)"
if [[ -z "$python" ]]; then
    echo "python-env: no python3 (Debian: apt-get install python3 python3-venv)" >&2
    exit 1
fi
if [[ ! -x "$venv/bin/python" ]] || ! cmp -s "$reqs" "$stamp"; then
    echo "python-env: installing the test requirements into $venv (once; several minutes)" >&2
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    "$venv/bin/python" -m pip install -q -r "$reqs" >&2
    cp "$reqs" "$stamp"
fi
# --no-build-isolation: the build backend comes from the environment, nothing is fetched
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --force-reinstall \
    "$root/python" >&2
echo "$venv/bin/python"
