#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces NAMEa and NAMEb joined by a veth pair, with
# addresses 10.SUBNET.1 and 10.SUBNET.2 (/24). Needs root and iproute2's `ip`.
#   netns_hosts.sh up NAME SUBNET     e.g. up lt123 77.0   (10.77.0.1 and 10.77.0.2)
#   netns_hosts.sh down NAME          removes both namespaces (and so the veth pair)
#   netns_hosts.sh link NAME up|down  takes the link between them up or down
# Traffic stays inside the two namespaces: nothing is routed to or from the host's network.
set -euo pipefail
cmd=$1 name=$2
case $cmd in
  up)
    subnet=$3
    ip netns add "${name}a"
    ip netns add "${name}b"
    ip link add "${name}va" type veth peer name "${name}vb"
    ip link set "${name}va" netns "${name}a"
    ip link set "${name}vb" netns "${name}b"
    ip -n "${name}a" addr add "10.${subnet}.1/24" dev "${name}va"
    ip -n "${name}b" addr add "10.${subnet}.2/24" dev "${name}vb"
    for s in a b; do
      ip -n "${name}$s" link set lo up
      ip -n "${name}$s" link set "${name}v$s" up
    done ;;
  down)
    ip netns del "${name}a" 2>/dev/null || true
    ip netns del "${name}b" 2>/dev/null || true ;;
  link)
    ip -n "${name}a" link set "${name}va" "$3" ;;
  *) echo "usage: $0 up NAME SUBNET | down NAME | link NAME up|down" >&2; exit 2 ;;
esac
