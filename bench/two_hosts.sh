#!/usr/bin/env bash
# Gloo all-reduce between two "hosts" (network namespaces over a veth pair; needs root and
# iproute2) beside a raw TCP stream over the same veth, in the same run (not a test).
# Usage: bench/two_hosts.sh   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
N=ltbench$$
bash scripts/netns_hosts.sh up $N 79.0
trap "bash scripts/netns_hosts.sh down $N" EXIT
echo "== raw TCP stream, 1 GiB, 10.79.0.2 -> 10.79.0.1 (python3 sockets)"
ip netns exec ${N}a python3 - <<'PY' &
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("10.79.0.1", 29700)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = time.time()
buf = bytearray(1 << 22)
while True:
    k = c.recv_into(buf)
    if not k: break
    n += k
print(f"raw TCP: {n / (time.time() - t0) / 1e9:.3f} GB/s ({n} bytes)")
PY
sleep 1
ip netns exec ${N}b python3 -c "
import socket
c = socket.create_connection(('10.79.0.1', 29700)); b = bytes(1 << 22)
for _ in range(256): c.sendall(b)
c.close()"
wait
echo "== Gloo all-reduce, 2 ranks (one per namespace)"
E="WORLD_SIZE=2 MASTER_ADDR=10.79.0.1 MASTER_PORT=29701"
ip netns exec ${N}b env $E RANK=1 build/bench_allreduce_env &
ip netns exec ${N}a env $E RANK=0 build/bench_allreduce_env
wait
lscpu | grep "Model name"
