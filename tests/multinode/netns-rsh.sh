#!/usr/bin/env bash
# Open MPI's remote shell for tests/multinode (mpirun --mca plm_rsh_agent): "logs in" to a
# host that is a network namespace on this machine. mpirun calls it like ssh:
#   netns-rsh.sh HOST ORTED-COMMAND...
# RA_MN_HOSTS (set by multinode.sh) maps each address to its namespace and hostname:
#   "ADDR=NETNS=HOSTNAME ...". The command runs in a new UTS namespace with that hostname, so
# that Open MPI sees two nodes, not one node reached twice.
set -euo pipefail

host="$1"
shift
for entry in ${RA_MN_HOSTS:-}; do
    IFS== read -r addr ns name <<<"$entry"
    if [[ "$addr" == "$host" ]]; then
        echo "netns-rsh: $host -> netns $ns (hostname $name)" >&2
        # Like ssh, the command arrives as words for a shell (Open MPI quotes for one).
        exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$name" "$*"
    fi
done
echo "netns-rsh: unknown host $host (RA_MN_HOSTS: ${RA_MN_HOSTS:-unset})" >&2
exit 255
