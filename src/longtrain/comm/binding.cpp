// GLOO_SOCKET_IFNAME, or the route to MASTER_ADDR, or loopback.
#include "longtrain/comm/binding.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "longtrain/core/check.h"

namespace lt::comm {

std::string GlooBinding::describe() const {
  if (interfaces.empty()) return "gloo binds " + hostname;
  std::string s = "gloo binds interface";
  for (const auto& i : interfaces) s += " " + i;
  return s + " (GLOO_SOCKET_IFNAME)";
}

std::string localAddressToward(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res);
  LT_CHECK(rc == 0 && res, "MASTER_ADDR '", host, "' does not resolve to an IPv4 address: ", ::gai_strerror(rc));
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const int c = fd < 0 ? -1 : ::connect(fd, res->ai_addr, res->ai_addrlen);
  const int err = errno;
  ::freeaddrinfo(res);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = c == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  LT_CHECK(ok, "no route to MASTER_ADDR '", host, "' from this host (", std::strerror(err),
           "); check the address, or name the interface with GLOO_SOCKET_IFNAME");
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
  return buf;
}

GlooBinding glooBindingFor(const std::string& masterAddr, const std::string& socketIfname) {
  GlooBinding b;
  if (!socketIfname.empty()) {
    std::stringstream ss(socketIfname);
    std::string name;
    while (std::getline(ss, name, ','))
      if (!name.empty()) b.interfaces.push_back(name);
    LT_CHECK(!b.interfaces.empty(), "GLOO_SOCKET_IFNAME='", socketIfname, "' names no interface (e.g. eth0,eth1)");
    return b;
  }
  if (masterAddr.empty() || masterAddr == "localhost") return b;
  b.hostname = localAddressToward(masterAddr);
  return b;
}

}  // namespace lt::comm
