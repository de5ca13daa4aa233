// Which network interface Gloo binds, torchrun's rules: GLOO_SOCKET_IFNAME when set (a comma
// list: one Gloo device per interface), else the local address of the route to MASTER_ADDR,
// else loopback. Non-obvious: the route's source address comes from connect() on a UDP socket,
// which sends nothing; it is the address the kernel would use to reach MASTER_ADDR, so ranks
// on two hosts advertise addresses their peers can reach instead of 127.0.0.1.
#pragma once
#include <string>
#include <vector>

namespace lt::comm {

struct GlooBinding {
  std::vector<std::string> interfaces;  // from GLOO_SOCKET_IFNAME; empty: bind `hostname`
  std::string hostname = "127.0.0.1";
  std::string describe() const;         // for the start-up line
};

// The binding for a rank whose environment names the master as `masterAddr` ("" : a local
// job) and, if non-empty, the interfaces `socketIfname` (GLOO_SOCKET_IFNAME's value).
GlooBinding glooBindingFor(const std::string& masterAddr, const std::string& socketIfname);

// The local IPv4 address the kernel routes `host` from; an lt::Error naming `host` if it does
// not resolve or no route leads there.
std::string localAddressToward(const std::string& host);

}  // namespace lt::comm
