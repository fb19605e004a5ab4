#!/usr/bin/env bash
# Assembles what the H200 check needs and the H200 image lacks (bench/gpu/README.md), in
# bench/gpu/prepared/ (ignored by git; the device command carries it): Catch2 2.x's single
# header (this machine's Debian catch2, installed when missing), and the emulation's recorded
# counters the check's roofline column reads (bench/testdata, already in the tree). Idempotent.
#   bash bench/gpu/prepare.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="$root/bench/gpu/prepared"
header=/usr/include/catch2/catch.hpp
if [[ ! -f "$header" ]]; then
    bash "$root/cmake/install-deps.sh" # Debian's catch2 among them
fi
mkdir -p "$dest/catch2"
cp "$header" "$dest/catch2/catch.hpp"
echo "prepare: $dest/catch2/catch.hpp ($(wc -c < "$dest/catch2/catch.hpp") bytes, Catch2 $(grep -m1 -oE 'Catch v[0-9.]+' "$header" || echo 2.x))"
echo "prepare: carry bench/gpu/prepared with the device command (bench/gpu/README.md)"
