"""Keeps `worker_binary` off the network.

`worker_binary` takes only `--port` and always serves on "[::]:PORT", i.e. on
every interface, unauthenticated. TFF 0.87's wheel has no in-process C++
executor bindings, so the binary cannot be avoided. `resolve_isolation` picks how
it is confined:

* "netns": in new user + network namespaces (no root needed) whose only interface
  is their own loopback, so nothing outside can reach the port. A bridge started
  inside the namespace (`netns_bridge.py`, run as a script) relays a Unix socket
  in a 0700 directory of ours to that port, so only our user can talk to the
  worker. Needs unprivileged user namespaces.
* "loopback": the binary runs with an LD_PRELOAD shim (`preload_shim.c`, compiled
  once with `cc` into the user's cache) that makes it bind 127.0.0.1 only. Used
  only where the kernel refuses namespaces; needs a C compiler.
* "none": the stock binary on every interface, only when asked for explicitly
  (`TFBFL_WORKER_ISOLATION=none`).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.resources
import os
import pathlib
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from typing import List, Optional

from tfbfl.runtime import lifetime

ISOLATION_ENV = "TFBFL_WORKER_ISOLATION"
ISOLATIONS = ("auto", "netns", "loopback", "none")
INNER_PORT = 10000  # The binary's port inside a fresh namespace (always free there).

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

# Files of this package: the bridge is a module (run as a script, never imported),
# the shim's C source is package data (setup.cfg, [options.package_data]).
BRIDGE_SCRIPT = pathlib.Path(__file__).resolve().with_name("netns_bridge.py")
_SHIM_SOURCE = importlib.resources.files(__package__).joinpath("preload_shim.c")


def enter_private_network() -> None:
  """`preexec_fn`: dies with its parent, then moves into new user + network
  namespaces (loopback up, nothing else). Raises OSError where the kernel refuses."""
  lifetime.die_with_parent()
  libc = lifetime.loaded_libc()
  if libc is None:
    raise OSError("no libc.so.6: network namespaces need Linux")
  uid, gid = os.getuid(), os.getgid()
  if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
    with open("/proc/self/uid_map", "w") as f:
      f.write(f"0 {uid} 1")
    with open("/proc/self/setgroups", "w") as f:
      f.write("deny")
    with open("/proc/self/gid_map", "w") as f:
      f.write(f"0 {gid} 1")
  elif libc.unshare(_CLONE_NEWNET) != 0:  # Root without user namespaces.
    errno = ctypes.get_errno()
    raise OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def bridge_command(binary: str, port: int, sock_path: str, max_calls: int) -> List[str]:
  """The command that runs `binary` behind the bridge (start it with
  `preexec_fn=enter_private_network`). `-I -S`: the bridge sees neither the
  environment's Python settings nor this package's directory."""
  return [
      sys.executable, "-I", "-S",
      str(BRIDGE_SCRIPT), binary,
      str(port), sock_path,
      str(max_calls)
  ]


_NETNS_OK = None


def netns_available() -> bool:
  """Whether this kernel lets us start a process in a private network namespace
  (probed once, with a trivial child)."""
  global _NETNS_OK
  if _NETNS_OK is None:
    lifetime.libc()
    try:
      subprocess.run([sys.executable, "-S", "-c", ""],
                     preexec_fn=enter_private_network,
                     check=True,
                     stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL,
                     timeout=30)
      _NETNS_OK = True
    except (subprocess.SubprocessError, OSError):
      _NETNS_OK = False
  return _NETNS_OK


def loopback_shim() -> Optional[str]:
  """The LD_PRELOAD shim, compiled once into the user's cache; None without a C
  compiler."""
  source = _SHIM_SOURCE.read_bytes()
  digest = hashlib.sha256(source).hexdigest()[:16]
  cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfbfl")
  path = os.path.join(cache, f"loopback_bind_{digest}.so")
  if os.path.isfile(path):
    return path
  compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
  if compiler is None:
    return None
  os.makedirs(cache, mode=0o700, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache) as tmp:
    src = os.path.join(tmp, "preload_shim.c")
    with open(src, "wb") as f:  # A copy: the package may not be a directory.
      f.write(source)
    out = os.path.join(tmp, "shim.so")
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", out, src, "-ldl"],
                          capture_output=True,
                          text=True,
                          timeout=120)
    if done.returncode != 0:
      return None
    os.replace(out, path)
  return path


def resolve_isolation(isolation: Optional[str] = None) -> str:
  """The isolation a new `WorkerProcess` gets: `isolation`, else the
  `TFBFL_WORKER_ISOLATION` environment variable, else "auto", which picks
  "netns" where the kernel allows it, else "loopback" where a C compiler exists.

  Raises:
    RuntimeError: "auto" found neither, or the requested one is unavailable.
  """
  choice = (isolation or os.environ.get(ISOLATION_ENV) or "auto").strip().lower()
  if choice not in ISOLATIONS:
    raise ValueError(f"{ISOLATION_ENV} must be one of {', '.join(ISOLATIONS)}, got {choice!r}.")
  if choice in ("auto", "netns") and netns_available():
    return "netns"
  if choice in ("auto", "loopback") and loopback_shim() is not None:
    return "loopback"
  if choice == "none":
    return "none"
  raise RuntimeError(
      f"cannot keep TFF's worker_binary off the network ({ISOLATION_ENV}={choice}): it always "
      "serves on all interfaces; tfbfl confines it to a private network namespace (needs "
      "unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
      "kernel.apparmor_restrict_unprivileged_userns=0) or to loopback with an LD_PRELOAD shim "
      f"(needs a C compiler, `cc`). Enable one, or set {ISOLATION_ENV}=none to accept an "
      "unauthenticated TFF service on every interface.")
