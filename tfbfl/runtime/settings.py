"""`RuntimeOptions`: where the TFF computations run, as flags (`set_runtime`'s arguments)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from tfbfl import options
from tfbfl.runtime import channels


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
  """Where the TFF computations run (`set_runtime`'s flags)."""
  executor: str = options.choice(
      "local", ("local", "remote"),
      "local: TFF worker on this machine; remote: the tfbfl-worker services in --workers.")
  workers: Optional[Sequence[str]] = options.str_list(
      None, "--executor=remote: worker addresses host:port,host:port (127.0.0.1 + SSH "
      "tunnels, or TLS; see BUILD.md).")
  call_timeout_s: float = options.real(
      600.0, "--executor=remote: deadline of each call to a worker (above the longest "
      "subround).",
      low_open=True,
      high=1e7)
  tls_ca: Optional[str] = options.text(
      None, "--executor=remote: PEM CA certificate that signed the workers' certificates; "
      "turns on TLS (workers run with --tls_cert/--tls_key). See BUILD.md.")
  tls_cert: Optional[str] = options.text(
      None, "--executor=remote: PEM client certificate of this controller, for workers "
      "started with --tls_client_ca (with --tls_key).")
  tls_key: Optional[str] = options.text(None, "--executor=remote: PEM private key of --tls_cert.")

  def check(self) -> None:
    """The flags' combinations; TLS files are read (a bad one is named)."""
    tls = any((self.tls_ca, self.tls_cert, self.tls_key))
    if self.executor == "remote" and not self.workers:
      raise ValueError("--executor=remote needs --workers=host:port[,host:port...].")
    if self.executor == "local" and self.workers:
      raise ValueError("--workers is only used with --executor=remote.")
    if self.executor != "remote" and tls:
      raise ValueError("--tls_ca/--tls_cert/--tls_key are only used with --executor=remote.")
    if tls:
      channels.channel_credentials(self.tls_ca, self.tls_cert, self.tls_key)  # names the bad flag
