#!/usr/bin/env bash
# Multi-node tests (ctest label multinode): two "hosts" as network namespaces, mpirun across
# them over TCP, results compared bit for bit with a run on one host.
#
#   multinode.sh plain|impaired TEST_RING_MPI RING_ATTENTION|none IMPAIR
#
# hostA and hostB are network namespaces joined by a veth pair (plain), or by two veth pairs
# through a third namespace, the wire, where IMPAIR (impair.c) holds every frame for 50 ms each
# way and drops 1% of them each way (impaired; the kernel has no sch_netem). mpirun runs in
# hostA with a hostfile of both addresses, 2 slots each; netns-rsh.sh starts hostB's orted
# through `ip netns exec`. Ranks 0, 1 run on hostA, 2, 3 on hostB, one thread each, over
# `--mca btl tcp,self` on the veth only. The same programs run first as `mpirun -n 4` on one
# host (hostA alone, default transports); every rank's output digests (RATEST_DIGEST of
# test_ring_mpi, --digest of the demo) must be identical. Exit 77 (ctest: skipped) with the
# reason where namespaces cannot be made (not root, no iproute2, no permission).
# RA_MN_COMM_TIMEOUT overrides the impaired run's RINGATTN_COMM_TIMEOUT (to find its margin).
set -uo pipefail

mode="${1:-}"
ring_exe="${2:-}" demo_exe="${3:-}" impair_exe="${4:-}"
if [[ ($mode != plain && $mode != impaired) || -z $impair_exe ]]; then
    echo "usage: $0 plain|impaired TEST_RING_MPI RING_ATTENTION|none IMPAIR" >&2
    exit 2
fi

skip() { echo "multinode: SKIPPED: $*"; exit 77; }
fail() { echo "multinode: FAILED: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, veth pairs)"
for tool in ip:iproute2 unshare:util-linux mpirun:openmpi-bin timeout:coreutils; do
    command -v "${tool%%:*}" >/dev/null ||
        skip "no '${tool%%:*}' command (Debian package ${tool#*:})"
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# ---- the phases' parameters ----
# The demo's problem is sized so that its traffic (about 40 MB each way across the link at
# --seq 8192: K/V forward, K/V and dK/dV backward) crosses the impaired link in seconds, not
# minutes (4 heads on 2 kv heads: the demo's traffic, half its compute). --threads 1: the same
# tiles and threads on one host and on two (the default depends on the ranks per node).
demo_args=(--seq 8192 --heads 4 --threads 1 --digest)
ring_filter=()                      # every test case of test_ring_mpi
mtu=1500
if [[ $mode == impaired ]]; then
    delay_ms=50 loss_pct=1          # each way: 100 ms round trip
    # A spurious timeout must show: a sixth of the suite's 30 s. The deadline counts time
    # without progress (heartbeats of computing and progressing ranks count), and every phase
    # passed at 1 s on 2 cores; 5 s leaves a loaded machine a margin against TCP's
    # retransmission backoff, and no more.
    export RINGATTN_COMM_TIMEOUT="${RA_MN_COMM_TIMEOUT:-5}"
    # The catalogue-wide cases are latency-bound (hundreds of collectives): the small cases,
    # which cover a sub-communicator, the agreement failures and global top-k, fit in time.
    ring_filter=('*sub-communicator*,*descriptor mismatch*,*NaN bias*,*top-k is global*,'\
'*keep_k mismatch*')
    # Jumbo frames, one TCP segment per frame (gso_max_segs 1): 1% of packets are lost, and a
    # TCP stream still moves MB/s at 100 ms RTT (64 KB segments instead of 1.5 KB).
    mtu=65000
fi
export OMP_NUM_THREADS=1 RATEST_BACKEND="${RATEST_BACKEND:-cpu}"
export RINGATTN_COMM_TIMEOUT="${RINGATTN_COMM_TIMEOUT:-30}"
phase_limit=120                     # seconds per mpirun: a hang fails the phase, not ctest

# ---- namespaces: made here, removed on any exit (stale ones of dead runs first) ----
prefix=ramn
for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    if [[ $ns =~ ^${prefix}([0-9]+)[abw]$ ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null; then
        echo "multinode: removing stale namespace $ns"
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    fi
done
A="${prefix}$$a" B="${prefix}$$b" W="${prefix}$$w"
for ns in "$A" "$B" "$W"; do ip netns del "$ns" 2>/dev/null; done # a dead run with our pid
addr_a=10.213.0.1 addr_b=10.213.0.2 subnet=10.213.0.0/24
work="$(mktemp -d "${TMPDIR:-/tmp}/ringattn-multinode.XXXXXX")"
impair_pid=
cleanup() {
    if [[ -n $impair_pid ]]; then
        kill "$impair_pid" 2>/dev/null
        wait "$impair_pid" 2>/dev/null
        cat "$work/impair.log" 2>/dev/null
    fi
    for ns in "$A" "$B" "$W"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$A" 2>"$work/err" || skip "cannot make a network namespace: $(cat "$work/err")"
ip netns add "$B" || fail "ip netns add $B"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
if [[ $mode == plain ]]; then
    ip link add ra0 netns "$A" type veth peer name ra0 netns "$B" 2>"$work/err" ||
        skip "cannot make a veth pair: $(cat "$work/err")"
else
    ip netns add "$W" || fail "ip netns add $W"
    ip link add ra0 netns "$A" type veth peer name wa netns "$W" 2>"$work/err" ||
        skip "cannot make a veth pair: $(cat "$work/err")"
    ip link add ra0 netns "$B" type veth peer name wb netns "$W" || fail "veth hostB-wire"
    for end in wa wb; do
        # promisc: the wire's ends see frames for the hosts' MACs, like a switch port
        ip -n "$W" link set "$end" mtu "$mtu" gso_max_segs 1 promisc on up || fail "wire $end up"
    done
fi
ip -n "$A" addr add "$addr_a/24" dev ra0 && ip -n "$B" addr add "$addr_b/24" dev ra0 ||
    fail "addresses"
for ns in "$A" "$B"; do
    ip -n "$ns" link set ra0 mtu "$mtu" gso_max_segs 1 up || fail "ra0 up in $ns"
done
if [[ $mode == impaired ]]; then
    ip netns exec "$W" "$impair_exe" wa wb "$delay_ms" "$loss_pct" 2024 2>"$work/impair.log" &
    impair_pid=$!
    sleep 0.3
    kill -0 "$impair_pid" 2>/dev/null || { cat "$work/impair.log"; fail "impair did not start"; }
fi

echo "multinode: mode $mode, hostA $A ($addr_a), hostB $B ($addr_b), mtu $mtu$(
    [[ $mode == impaired ]] && echo ", wire $W: ${delay_ms} ms delay and ${loss_pct}% loss each way"
), RINGATTN_COMM_TIMEOUT=$RINGATTN_COMM_TIMEOUT"

# The round trip: a connect to a closed port of hostB is refused after one (the second try: the
# first also resolves hostB's MAC). Impaired, it must be at least the two delays.
rtt=
for try in 1 2; do
    t0=$(date +%s%N)
    ip netns exec "$A" timeout 5 bash -c "exec 3<>/dev/tcp/$addr_b/9" 2>/dev/null
    rtt=$(( ($(date +%s%N) - t0) / 1000000 ))
done
echo "multinode: round trip hostA -> hostB about $rtt ms (a refused connect, with the tools' start)"
if [[ $mode == impaired ]] && (( rtt < 2 * delay_ms )); then
    fail "round trip $rtt ms, below 2 x $delay_ms ms: the wire does not delay"
fi

# ---- mpirun ----
cp "$here/netns-rsh.sh" "$work/rsh" && chmod +x "$work/rsh"
export RA_MN_HOSTS="$addr_a=$A=ramn-hosta $addr_b=$B=ramn-hostb"
printf '%s slots=2\n%s slots=2\n' "$addr_a" "$addr_b" >"$work/hosts"
forward=(-x OMP_NUM_THREADS -x RATEST_BACKEND -x RINGATTN_COMM_TIMEOUT)
for v in OPENBLAS_CORETYPE RINGATTN_LOG MALLOC_PERTURB_ ASAN_OPTIONS UBSAN_OPTIONS; do
    [[ -n ${!v:-} ]] && forward+=(-x "$v")
done
one_host=(ip netns exec "$A" timeout -k 5 "$phase_limit"
          mpirun -n 4 --oversubscribe --allow-run-as-root "${forward[@]}")
two_hosts=(ip netns exec "$A" unshare --uts sh -c 'hostname ramn-hosta && exec "$@"' sh
           timeout -k 5 "$phase_limit"
           mpirun -n 4 --hostfile "$work/hosts" --oversubscribe --allow-run-as-root
           --mca plm_rsh_agent "$work/rsh" --mca plm_rsh_no_tree_spawn 1 --mca mpi_yield_when_idle 1
           --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet"
           "${forward[@]}")

link_bytes() { # bytes hostA sent and received on its end of the link
    local s=/sys/class/net/ra0/statistics
    ip netns exec "$A" cat "$s/tx_bytes" "$s/rx_bytes" | paste -sd' '
}

# phase NAME MIN_LINK_BYTES COMMAND...: runs it, prints its time and (two hosts) the bytes that
# crossed the link; fails when it fails, or when less than MIN_LINK_BYTES crossed either way.
phase() {
    local name="$1" min="$2"
    shift 2
    local before t0 t1 rc
    before="$(link_bytes)"
    t0=$(date +%s.%N)
    "$@" >"$work/$name.out" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    read -r tx0 rx0 <<<"$before"
    read -r tx1 rx1 <<<"$(link_bytes)"
    printf 'multinode: phase %-16s %6.1f s, rc %d, link: A->B %d bytes, B->A %d bytes\n' \
        "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        "$rc" $((tx1 - tx0)) $((rx1 - rx0))
    if [[ $rc -ne 0 ]]; then
        tail -n 60 "$work/$name.out"
        [[ $rc -eq 124 || $rc -eq 137 ]] && fail "phase $name: over ${phase_limit} s (rc $rc)"
        fail "phase $name exited $rc"
    fi
    if (( tx1 - tx0 < min || rx1 - rx0 < min )); then
        fail "phase $name: under $min bytes crossed the link one way: not two hosts?"
    fi
}

# same NAME FILE_ONE FILE_TWO: the one-host and two-host digests are identical
same() {
    [[ -s $2 ]] || fail "$1: no digest from the one-host run (a test filter that matches nothing?)"
    if ! cmp -s "$2" "$3"; then
        echo "one host (<) vs two hosts (>):"
        diff "$2" "$3" | head -n 20
        fail "$1: outputs differ between one host and two hosts"
    fi
    echo "multinode: $1: $(wc -l <"$2") digest line(s) identical on one host and two hosts"
}

# Where the ranks run: two per host, hostB's through the agent (its own hostname).
phase placement 1 "${two_hosts[@]}" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname)"'
sort "$work/placement.out" | sed 's/^/  /'
[[ $(grep -c 'on ramn-hosta$' "$work/placement.out") -eq 2 &&
   $(grep -c 'on ramn-hostb$' "$work/placement.out") -eq 2 ]] || fail "ranks not 2 per host"

phase ring_one_host 0 env RATEST_DIGEST="$work/ring1" \
    "${one_host[@]}" "$ring_exe" "${ring_filter[@]}"
phase ring_two_hosts 10000 \
    "${two_hosts[@]}" -x RATEST_DIGEST="$work/ring2" "$ring_exe" "${ring_filter[@]}"
for r in 0 1 2 3; do same "test_ring_mpi rank $r" "$work/ring1.$r" "$work/ring2.$r"; done
# its 2D plans (2 x 2, groups of consecutive ranks: the all-to-all inside each host, the ring
# between them) are among those lines, unless a filter left them out (impaired: the demo's 2D
# plan below crosses the impaired link)
if [[ ${#ring_filter[@]} -eq 0 ]]; then
    grep -q '^2D plans over MPI' "$work/ring1.0" || fail "test_ring_mpi ran no 2D plan"
    echo "multinode: $(grep -c '^2D plans over MPI' "$work/ring1.0") of them 2D plans (all-to-all inside each host)"
fi

if [[ $demo_exe == none ]]; then
    echo "multinode: $mode: passed (no demo: examples not built)"
    exit 0
fi
phase demo_one_host 0 "${one_host[@]}" "$demo_exe" "${demo_args[@]}"
phase demo_two_hosts 1000000 "${two_hosts[@]}" "$demo_exe" "${demo_args[@]}"
for w in one_host two_hosts; do
    grep '^digest' "$work/demo_$w.out" >"$work/demo_$w.digest"
    [[ $(wc -l <"$work/demo_$w.digest") -eq 4 ]] || fail "demo ($w) printed no digest of 4 ranks"
done
for w in one_host two_hosts; do
    grep -E '^(forward|backward):' "$work/demo_$w.out" | sed "s/^/  demo, ${w/_/ }: /"
done
same "ring_attention demo" "$work/demo_one_host.digest" "$work/demo_two_hosts.digest"
# the demo's 2D plan (--ulysses 2): the same bits on one host and two, and the bytes on the link
phase demo2d_one_host 0 "${one_host[@]}" "$demo_exe" "${demo_args[@]}" --ulysses 2
phase demo2d_two_hosts 1000000 "${two_hosts[@]}" "$demo_exe" "${demo_args[@]}" --ulysses 2
for w in one_host two_hosts; do
    grep '^digest' "$work/demo2d_$w.out" >"$work/demo2d_$w.digest"
    [[ $(wc -l <"$work/demo2d_$w.digest") -eq 4 ]] || fail "2D demo ($w) printed no digest of 4 ranks"
done
same "ring_attention demo, 2 x 2" "$work/demo2d_one_host.digest" "$work/demo2d_two_hosts.digest"
if [[ $mode == impaired ]]; then # the wire dropped frames both ways (its counts, at its exit)
    kill "$impair_pid" && wait "$impair_pid"
    impair_pid=
    cat "$work/impair.log"
    [[ $(grep -c ', [1-9][0-9]* dropped (loss)' "$work/impair.log") -eq 2 ]] ||
        fail "the wire dropped no frame one way"
fi
echo "multinode: $mode: passed"
