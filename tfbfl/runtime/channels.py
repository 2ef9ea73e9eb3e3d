"""gRPC channel settings, worker addresses and TLS credentials (local and remote)."""

from __future__ import annotations

from typing import Optional

import grpc

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
# Every channel to a worker (and `tfbfl-worker`'s server) allows TFF's 2 GB messages.
GRPC_OPTIONS = [
    ("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
]
# A worker this process starts listens within ~0.3 s; gRPC's default reconnect back-off
# (1 s, growing) would have the first connect wait a second for it.
LOCAL_WORKER_OPTIONS = GRPC_OPTIONS + [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
]


def parse_worker_address(address: str) -> str:
  """Checks a "host:port", "[v6]:port" or "unix:/abs/path" worker address;
  returns it stripped."""
  address = str(address).strip()
  if address.startswith("unix:/"):
    return address
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"worker address must be host:port, got {address!r}.")
  return address


def read_pem(path: Optional[str], flag: str) -> Optional[bytes]:
  """The PEM file at `path` (None if no path); a ValueError names `--flag`."""
  if not path:
    return None
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ValueError(f"--{flag}: cannot read {path}: {e.strerror or e}.") from None
  if b"-----BEGIN " not in data:
    raise ValueError(f"--{flag}: {path} is not a PEM file.")
  return data


def channel_credentials(tls_ca: Optional[str] = None,
                        tls_cert: Optional[str] = None,
                        tls_key: Optional[str] = None) -> Optional[grpc.ChannelCredentials]:
  """Controller-side TLS credentials from PEM files, or None (plaintext) if no
  file is given.

  Args:
    tls_ca: CA certificate(s) that signed the workers' certificates (verifies them).
    tls_cert, tls_key: this controller's client certificate and private key,
      presented to workers started with `--tls_client_ca`; both or neither.

  Raises:
    ValueError: naming the flag of an unreadable or inconsistent file.
  """
  if bool(tls_cert) != bool(tls_key):
    raise ValueError("--tls_cert and --tls_key must be given together.")
  if not (tls_ca or tls_cert):
    return None
  if not tls_ca:
    raise ValueError("--tls_cert/--tls_key need --tls_ca (the CA that signed the workers' "
                     "certificates).")
  return grpc.ssl_channel_credentials(root_certificates=read_pem(tls_ca, "tls_ca"),
                                      private_key=read_pem(tls_key, "tls_key"),
                                      certificate_chain=read_pem(tls_cert, "tls_cert"))
