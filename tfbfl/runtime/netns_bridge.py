"""The bridge run inside the worker's private network namespace ("netns" isolation).

Not imported by tfbfl: `WorkerProcess` runs this file as a script, in new user +
network namespaces (see `isolation.enter_private_network`):

    python -I -S netns_bridge.py BINARY PORT SOCK_PATH MAX_CALLS

It starts `BINARY --port=PORT` (`worker_binary`, which serves on every interface of
the namespace, i.e. only on its own loopback), waits for the port, then relays the
Unix socket SOCK_PATH (in a 0700 directory of the parent's) to it, so that only
the parent's user can reach the worker. It ends, taking the binary with it, on
SIGTERM/SIGINT, when the binary exits (with the binary's exit code), or when its
own parent dies (PR_SET_PDEATHSIG, as the binary does when the bridge dies). The
parent's death reaches it as SIGTERM, not SIGKILL, so that it removes the socket
and its directory (if then empty) itself: a parent killed by a signal cleans up
nothing.

Standard library only, and `-I -S` (no site, no user paths, not even this
directory): it must start fast and must not depend on the parent's environment.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def _die_with_parent(signum=signal.SIGKILL):
  ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signum)


def _remove_socket(sock_path):
  for path in (sock_path + ".tmp", sock_path):
    try:
      os.unlink(path)
    except OSError:
      pass
  try:
    os.rmdir(os.path.dirname(sock_path))
  except OSError:  # Not empty, or already removed by the parent.
    pass


def _pump(src, dst):
  """Copies `src` to `dst` until `src` closes, then half-closes both."""
  try:
    while True:
      data = src.recv(1 << 20)
      if not data:
        break
      dst.sendall(data)
  except OSError:
    pass
  for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
    try:
      s.shutdown(how)
    except OSError:
      pass


def _relay(conn, port):
  """Relays one Unix-socket connection to the binary's TCP port, both ways."""
  try:
    up = socket.create_connection(("127.0.0.1", port))
  except OSError:
    conn.close()
    return
  for s in (conn, up):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 21)
  up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  t = threading.Thread(target=_pump, args=(up, conn), daemon=True)
  t.start()
  _pump(conn, up)
  t.join()
  conn.close()
  up.close()


def main(argv):
  binary, port, sock_path, max_calls = argv[1], int(argv[2]), argv[3], argv[4]
  child = subprocess.Popen(
      [binary, f"--port={port}", f"--max_concurrent_computation_calls={max_calls}"],
      stdin=subprocess.DEVNULL,
      preexec_fn=_die_with_parent)
  stopping = []

  def stop(signum, frame):
    del frame
    stopping.append(signum)
    _remove_socket(sock_path)  # First: `watch` exits the process once the child is gone.
    child.terminate()
    try:
      child.wait(5)
    except subprocess.TimeoutExpired:
      child.kill()
    os._exit(0)

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  # Re-armed only now that `stop` handles it; until here the SIGKILL that
  # `enter_private_network` asked for applies, so there is no window without one.
  _die_with_parent(signal.SIGTERM)

  def watch():
    code = child.wait()
    os._exit(0 if stopping else code if code >= 0 else 128 - code)

  threading.Thread(target=watch, daemon=True).start()
  while True:  # Until the binary accepts connections (or `watch` exits with it).
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      break
    except OSError:
      time.sleep(0.1)
  # Bound under a temporary name, then renamed: a client (the parent's gRPC
  # channel) finds either no socket or one that accepts connections.
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(sock_path + ".tmp")
  os.rename(sock_path + ".tmp", sock_path)
  listener.listen(64)
  while True:
    conn, _ = listener.accept()
    threading.Thread(target=_relay, args=(conn, port), daemon=True).start()


if __name__ == "__main__":
  main(sys.argv)
