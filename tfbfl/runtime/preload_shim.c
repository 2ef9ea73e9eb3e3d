/* LD_PRELOAD shim for tfbfl's "loopback" worker isolation (tfbfl/runtime/isolation.py).
 *
 * TFF's worker_binary always binds its port on every interface ("[::]:PORT").
 * Preloaded into it, this bind() rewrites a wildcard address to the loopback one:
 * 0.0.0.0 -> 127.0.0.1, and :: -> ::ffff:127.0.0.1 (the IPv4 loopback only, with
 * IPV6_V6ONLY off so the mapped address is accepted). Every other bind() is passed
 * through unchanged.
 *
 * Built at run time, once per user, into ~/.cache/tfbfl/loopback_bind_<hash>.so:
 *   cc -shared -fPIC -O2 -o loopback_bind.so preload_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t);
  if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
  if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return real(fd, (const struct sockaddr *)&a, sizeof a);
  }
  if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      int off = 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      static const unsigned char v4lo[16] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff,127,0,0,1};
      memcpy(&a.sin6_addr, v4lo, 16);
    }
    return real(fd, (const struct sockaddr *)&a, sizeof a);
  }
  return real(fd, addr, len);
}
