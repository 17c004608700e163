#!/usr/bin/env bash
# Two hosts on one machine: network namespaces nlmpi_a and nlmpi_b joined by a veth pair
# (10.77.0.1 and 10.77.0.2), each with its own hostname. mpirun starts in nlmpi_a and launches the
# second rank's daemon in nlmpi_b through a launcher agent that enters that namespace (in place of
# ssh), and MPI is told to use TCP only (btl self,tcp) over the veth subnet, so the two ranks talk
# over a network link, not shared memory. The 2-rank run's losses and final checkpoint must equal
# one process's, bit for bit (train.grad_shards = 2, one thread per rank).
#   tests/mpi/two_hosts.sh [build/normlab]      needs root (ip netns, unshare), mpirun
# Exit 0: equal; 1: different or failed; 77: this machine cannot make network namespaces (skipped).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
binary="$(realpath "${1:-build/normlab}")"
[[ -x "$binary" ]] || { echo "two_hosts.sh: expected the normlab program at $binary, found none" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "two_hosts.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }

work="$(mktemp -d /tmp/normlab-two-hosts-XXXXXX)"
a=nlmpi_a b=nlmpi_b
cleanup() {
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null; then
    echo "two_hosts.sh: SKIPPED: cannot create a network namespace here (needs root and CAP_SYS_ADMIN)" >&2
    exit 77
fi
ip netns add "$b"
ip link add veth_nla type veth peer name veth_nlb
ip link set veth_nla netns "$a"
ip link set veth_nlb netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev veth_nla
ip -n "$b" addr add 10.77.0.2/24 dev veth_nlb
for ns in "$a" "$b"; do
    ip -n "$ns" link set lo up
done
ip -n "$a" link set veth_nla up
ip -n "$b" link set veth_nlb up

# The launcher agent: called as `agent HOST COMMAND...` the way mpirun calls ssh; the namespace's
# hostname (host-a, host-b) makes the two look like two machines to MPI.
cat >"$work/agent" <<AGENT
#!/bin/sh
host="\$1"; shift
case "\$host" in
    10.77.0.1) ns=$a name=host-a ;;
    10.77.0.2) ns=$b name=host-b ;;
    *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name; \$*"
AGENT
chmod +x "$work/agent"

args=(train configs/toy_transformer.json --quiet --set train.steps=12 --set optim.warmup_steps=3
      --set train.eval_every=6 --set train.batch_size=16 --set data.eval_sequences=64 --set train.grad_shards=2)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# One OpenBLAS kernel for both runs (the program alone may correct OpenBLAS's choice by restarting
# itself; a rank under mpirun does not): the one `normlab info` reports.
OPENBLAS_CORETYPE="$("$binary" info | sed -n 's/.*(kernel: \([A-Za-z0-9]*\).*/\1/p')"
export OPENBLAS_CORETYPE
"$binary" "${args[@]}" --out "$work/one"
mpi=(mpirun --allow-run-as-root -np 2 --host 10.77.0.1:1,10.77.0.2:1
     --mca plm_rsh_agent "$work/agent" --mca btl self,tcp
     --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
     -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x OPENBLAS_CORETYPE)
in_a() { timeout -k 10 120 ip netns exec "$a" unshare --uts sh -c "hostname host-a; exec \"\$@\"" sh "$@"; }
# Each rank's host and network: rank 0 must be host-a at 10.77.0.1, rank 1 host-b at 10.77.0.2.
where="$(in_a "${mpi[@]}" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(hostname) $(ip -o -4 addr show | grep -o "10\.77\.0\.[0-9]")"' | sort)"
echo "$where"
if [[ "$where" != $'rank 0 host-a 10.77.0.1\nrank 1 host-b 10.77.0.2' ]]; then
    echo "two_hosts.sh: expected rank 0 on host-a (10.77.0.1) and rank 1 on host-b (10.77.0.2), found the above" >&2
    exit 1
fi
tx_bytes() { ip netns exec "$a" cat /sys/class/net/veth_nla/statistics/tx_bytes; }
before="$(tx_bytes)"
in_a "${mpi[@]}" "$binary" "${args[@]}" --out "$work/two"
sent=$(($(tx_bytes) - before))
echo "two_hosts.sh: host-a sent $sent bytes over the veth link during the 2-rank run"
# 12 steps each send at least one copy of the gradient (4 bytes per parameter) to the other rank.
parameters="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["parameters"])' "$work/two/summary.json" 2>/dev/null ||
              grep -o '"parameters": *[0-9]*' "$work/two/summary.json" | grep -o '[0-9]*$')"
if ((sent < 12 * 4 * parameters)); then
    echo "two_hosts.sh: expected at least 12 x 4 x $parameters bytes over the link (one gradient per step), found $sent" >&2
    exit 1
fi

if cmp -s "$work/one/checkpoints/step_00000012.safetensors" "$work/two/checkpoints/step_00000012.safetensors" &&
    diff <(cut -d, -f1-7 "$work/one/metrics.csv") <(cut -d, -f1-7 "$work/two/metrics.csv") >/dev/null; then
    echo "two_hosts.sh: 2 ranks in two network namespaces over TCP: the same losses and checkpoint as one process"
    cut -d, -f1,3 "$work/two/metrics.csv" | tr '\n' ' '
    echo
    exit 0
fi
echo "two_hosts.sh: the 2-rank run over TCP differs from one process:" >&2
diff <(cut -d, -f1-7 "$work/one/metrics.csv") <(cut -d, -f1-7 "$work/two/metrics.csv") >&2 || true
exit 1
