"""Nothing we start listens beyond loopback unless asked; TLS with client
certificates works and refuses a client without one; a hung worker is an error
within one call_timeout_s.

Listening sockets are read per process from /proc/<pid>/net/tcp{,6} (the
process's own network namespace) and matched to its socket inodes. A listener in
a private network namespace whose only interface is loopback is unreachable from
outside and is not counted as exposed.
"""

import datetime
import ipaddress
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import portpicker
import psutil
import pytest

from tfbfl import runtime

_LISTEN = "0A"


# ----------------------------------------------------------------- helpers
def _hex_to_ip(hex_addr):
  raw = bytes.fromhex(hex_addr)
  if len(raw) == 4:
    return ipaddress.IPv4Address(raw[::-1])
  # /proc prints IPv6 as four little-endian 32-bit words.
  ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
  return ip.ipv4_mapped or ip  # ::ffff:127.0.0.1 is 127.0.0.1


def _is_loopback(ip):
  return ip.is_loopback


def _netns(pid):
  return os.readlink(f"/proc/{pid}/ns/net")


def _interfaces(pid):
  with open(f"/proc/{pid}/net/dev") as f:
    return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


def _listeners(pid):
  """(ip, port) of every TCP socket of `pid` in LISTEN state."""
  inodes = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue
    if target.startswith("socket:["):
      inodes.add(target[8:-1])
  found = []
  for table in ("tcp", "tcp6"):
    try:
      with open(f"/proc/{pid}/net/{table}") as f:
        rows = f.readlines()[1:]
    except OSError:
      continue
    for row in rows:
      cols = row.split()
      if cols[3] == _LISTEN and cols[9] in inodes:
        addr, port = cols[1].split(":")
        found.append((_hex_to_ip(addr), int(port, 16)))
  return found


def exposed_listeners(root_pid, include_root=True):
  """Listening sockets reachable from other machines, of `root_pid` and its
  descendants: [(pid, ip, port)]. A process in another network namespace counts
  unless that namespace has only a loopback interface."""
  root = psutil.Process(root_pid)
  procs = ([root] if include_root else []) + root.children(recursive=True)
  ours = _netns(os.getpid())
  exposed = []
  for proc in procs:
    try:
      private = _netns(proc.pid) != ours and _interfaces(proc.pid) == ["lo"]
      for ip, port in _listeners(proc.pid):
        if not (private or _is_loopback(ip)):
          exposed.append((proc.pid, str(ip), port))
    except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
      continue
  return exposed


def _all_listeners(root_pid):
  root = psutil.Process(root_pid)
  return [(p.pid, str(ip), port)
          for p in [root] + root.children(recursive=True)
          for ip, port in _listeners(p.pid)]


def _start_worker(tmp_path, port, *extra):
  out = open(tmp_path / f"worker_{port}.out", "wb")  # pylint: disable=consider-using-with
  proc = subprocess.Popen([
      sys.executable, "-m", "tfbfl.worker", f"--port={port}", f"--log_dir={tmp_path}",
      "--max_concurrent_computation_calls=1", *extra
  ],
                          stdin=subprocess.DEVNULL,
                          stdout=out,
                          stderr=subprocess.STDOUT)
  out.close()
  deadline = time.time() + 60
  text = ""
  while time.time() < deadline:
    text = (tmp_path / f"worker_{port}.out").read_text()
    if "listening on" in text:
      return proc, text
    if proc.poll() is not None:
      break
    time.sleep(0.1)
  _stop(proc)
  raise AssertionError(f"tfbfl-worker did not start:\n{text}")


def _stop(proc):
  tree = []
  try:
    tree = psutil.Process(proc.pid).children(recursive=True)
  except psutil.NoSuchProcess:
    pass
  for p in [psutil.Process(proc.pid)] + tree if proc.poll() is None else tree:
    try:
      p.send_signal(signal.SIGCONT)
    except psutil.NoSuchProcess:
      pass
  if proc.poll() is None:
    proc.terminate()
  try:
    code = proc.wait(timeout=20)
  except subprocess.TimeoutExpired:
    proc.kill()
    code = proc.wait()
  gone, alive = psutil.wait_procs(tree, timeout=10)
  del gone
  for p in alive:
    p.kill()
  assert not alive, f"left behind: {alive}"
  return code


def _mean_computation():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(values):
    return tff.federated_mean(values)

  return mean


# ----------------------------------------------------- local: no open port
def test_local_run_opens_no_network_port(tff_runtime):
  mean = _mean_computation()
  assert float(mean([1.0, 2.0, 6.0])) == pytest.approx(3.0)
  worker = tff_runtime.worker
  assert worker.alive()
  me = os.getpid()
  assert exposed_listeners(me) == [], _all_listeners(me)
  assert worker.isolation in ("netns", "loopback"), worker.isolation
  # The worker's own tree: nothing reachable; under netns no TCP port at all here.
  if worker.isolation == "netns":
    assert worker.address.startswith("unix:")
    ours = _netns(me)
    assert all(port != worker.port or _netns(pid) != ours
               for pid, _, port in _all_listeners(worker.process.pid))


def test_the_check_sees_an_open_worker(tmp_path):
  """The same check flags TFF's stock binary, which serves on every interface."""
  open_worker = runtime.WorkerProcess(isolation="none",
                                      log_dir=str(tmp_path),
                                      max_concurrent_computation_calls=1)
  try:
    exposed = exposed_listeners(open_worker.process.pid)
    assert [port for _, _, port in exposed] == [open_worker.port], exposed
  finally:
    open_worker.close()
  isolated = runtime.WorkerProcess(log_dir=str(tmp_path), max_concurrent_computation_calls=1)
  try:
    assert exposed_listeners(isolated.process.pid) == []
  finally:
    isolated.close()
  assert not isolated.alive() and not open_worker.alive()
  if runtime._loopback_shim() is not None:  # pylint: disable=protected-access
    # The fallback where namespaces are not allowed: the binary binds loopback.
    shimmed = runtime.WorkerProcess(isolation="loopback",
                                    log_dir=str(tmp_path),
                                    max_concurrent_computation_calls=1)
    try:
      assert exposed_listeners(shimmed.process.pid) == []
      assert [(str(ip), port) for ip, port in _listeners(shimmed.process.pid)] == [("127.0.0.1",
                                                                                    shimmed.port)]
    finally:
      shimmed.close()
  with pytest.raises(ValueError, match="TFBFL_WORKER_ISOLATION"):
    runtime.resolve_isolation("sometimes")


def test_remote_runtime_reaches_a_worker_socket(tff_runtime, tmp_path):
  """`WorkerProcess.address` ("unix:/...") is a valid `RemoteRuntime` worker."""
  del tff_runtime
  worker = runtime.WorkerProcess(log_dir=str(tmp_path), max_concurrent_computation_calls=1)
  try:
    mean = _mean_computation()
    with runtime.RemoteRuntime([worker.address], call_timeout_s=60):
      assert float(mean([1.0, 2.0, 6.0])) == pytest.approx(3.0)
  finally:
    worker.close()
  if worker.address.startswith("unix:"):
    assert not os.path.exists(worker.address[5:]), "socket left behind"


# ------------------------------------------------------------- tfbfl-worker
def test_worker_binds_loopback_by_default_and_host_opens_it(tmp_path):
  port = portpicker.pick_unused_port()
  proc, text = _start_worker(tmp_path, port)
  try:
    assert f"listening on 127.0.0.1:{port} (this machine only" in text, text
    assert exposed_listeners(proc.pid) == [], _all_listeners(proc.pid)
    assert (proc.pid, "127.0.0.1", port) in _all_listeners(proc.pid)
  finally:
    assert _stop(proc) == 0
  port = portpicker.pick_unused_port()
  proc, text = _start_worker(tmp_path, port, "--host=0.0.0.0")
  try:
    assert f"listening on 0.0.0.0:{port} (OPEN to the network" in text, text
    assert "WARNING: --host=0.0.0.0 without --tls_client_ca" in text
    assert [p for _, _, p in exposed_listeners(proc.pid)] == [port]
  finally:
    assert _stop(proc) == 0


# ---------------------------------------------------------------------- TLS
def _make_pki(directory):
  """A CA, a worker certificate for localhost/127.0.0.1 and a client certificate."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import NameOID  # pylint: disable=g-import-not-at-top

  now = datetime.datetime.now(datetime.timezone.utc)
  name = lambda cn: x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

  def write(stem, key, cert):
    (directory / f"{stem}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))
    (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

  def issue(cn, issuer_name, issuer_key, key, ca=False, san=None):
    builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer_name).public_key(
        key.public_key()).serial_number(
            x509.random_serial_number()).not_valid_before(now - datetime.timedelta(
                minutes=5)).not_valid_after(now + datetime.timedelta(days=1)).add_extension(
                    x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
      builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())

  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca = issue("tfbfl test CA", name("tfbfl test CA"), ca_key, ca_key, ca=True)
  write("ca", ca_key, ca)
  key = ec.generate_private_key(ec.SECP256R1())
  write(
      "worker", key,
      issue("localhost",
            ca.subject,
            ca_key,
            key,
            san=[x509.DNSName("localhost"),
                 x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
  key = ec.generate_private_key(ec.SECP256R1())
  write("client", key, issue("controller", ca.subject, ca_key, key))


def test_tls_with_client_certificates(tff_runtime, tmp_path):
  del tff_runtime  # Imports TFF; the session context is restored afterwards.
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top

  pytest.importorskip("cryptography")
  _make_pki(tmp_path)
  pem = lambda stem, ext="pem": str(tmp_path / f"{stem}.{ext}")
  port = portpicker.pick_unused_port()
  proc, text = _start_worker(tmp_path, port, f"--tls_cert={pem('worker')}",
                             f"--tls_key={pem('worker', 'key')}", f"--tls_client_ca={pem('ca')}")
  try:
    assert "TLS, client certificates required" in text, text
    address = f"localhost:{port}"
    mean = _mean_computation()
    with runtime.RemoteRuntime([address],
                               tls_ca=pem("ca"),
                               tls_cert=pem("client"),
                               tls_key=pem("client", "key"),
                               call_timeout_s=60,
                               connect_timeout_s=20):
      assert float(mean([1.0, 2.0, 6.0])) == pytest.approx(3.0)
    # A client with no certificate, and a plaintext client, are refused.
    for credentials in (runtime.channel_credentials(tls_ca=pem("ca")), None):
      stub = runtime.DeadlineGrpcStub(address, call_timeout_s=5, credentials=credentials)
      try:
        with pytest.raises(runtime.WorkerError) as info:
          stub.get_executor(executor_pb2.GetExecutorRequest())
        assert info.value.status_code == grpc.StatusCode.UNAVAILABLE, info.value
      finally:
        stub.close()
    with pytest.raises(runtime.WorkerError, match="not reachable"):
      runtime.RemoteRuntime([address], tls_ca=pem("ca"), connect_timeout_s=2).start()
  finally:
    assert _stop(proc) == 0
  with pytest.raises(ValueError, match="--tls_key"):
    runtime.RemoteRuntime(["localhost:1"], tls_ca=pem("ca"), tls_cert=pem("client"))
  with pytest.raises(ValueError, match="--tls_ca: cannot read"):
    runtime.RemoteRuntime(["localhost:1"], tls_ca=str(tmp_path / "missing.pem"))


def test_worker_refuses_bad_tls_flags(tmp_path):
  (tmp_path / "x.pem").write_text("not a certificate")
  for flags_, message in [(["--tls_cert=" + str(tmp_path / "x.pem")], "--tls_key must be given"),
                          (["--tls_client_ca=" + str(tmp_path / "x.pem")], "--tls_client_ca needs"),
                          ([f"--tls_cert={tmp_path}/x.pem",
                            f"--tls_key={tmp_path}/x.pem"], "--tls_key: .* is not a PEM file")]:
    out = subprocess.run([sys.executable, "-m", "tfbfl.worker", "--port=1", *flags_],
                         capture_output=True,
                         text=True,
                         timeout=60)
    assert out.returncode == 1, out
    assert __import__("re").search(message, out.stderr), out.stderr


# ------------------------------------------------------------- hung worker
def test_hung_worker_fails_within_one_call_timeout(tff_runtime, tmp_path):
  del tff_runtime
  port = portpicker.pick_unused_port()
  proc, _ = _start_worker(tmp_path, port)
  timeout_s = 4.0
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  # Several arguments: TFF sends them one RPC after another, as a round does.
  @tff.federated_computation(tff.FederatedType(np.float32, tff.SERVER),
                             tff.FederatedType(np.float32, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(a, b, values):
    return a, b, tff.federated_mean(values)

  try:
    with runtime.RemoteRuntime([f"localhost:{port}"],
                               call_timeout_s=timeout_s,
                               connect_timeout_s=20):
      assert [float(v) for v in mean(0.0, 1.0, [1.0, 2.0, 6.0])] == [0.0, 1.0, 3.0]
      tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
      for p in tree:
        p.send_signal(signal.SIGSTOP)
      t0 = time.monotonic()
      with pytest.raises(runtime.WorkerError, match=f"localhost:{port} did not answer") as info:
        mean(0.0, 1.0, [1.0, 2.0, 6.0])
      elapsed = time.monotonic() - t0
      assert info.value.status_code == grpc.StatusCode.DEADLINE_EXCEEDED
      # One call timeout, not one per RPC (three here): under 2x, on a loaded machine too.
      assert elapsed < 2 * timeout_s, f"hung worker reported after {elapsed:.1f} s"
  finally:
    assert _stop(proc) == 0
