"""The plug-in contract: optional hooks are Protocols, checked when an algorithm registers."""

import dataclasses

import pytest

from tfbfl.algorithms import base
from tfbfl.algorithms import registry


class _Core:
  """The four members of `base.FederatedAlgorithm`."""

  def initial_server_state(self):
    return 0

  def initial_client_state(self, client_index):
    return client_index

  def next(self, server_state, client_states, seeds, data):
    return server_state, client_states, {}

  def evaluate(self, server_state, client_states, seeds, test_data):
    return []


@dataclasses.dataclass(frozen=True)
class _Config:
  pass


def _spec(name, cls):
  return registry.AlgorithmSpec(name, _Config, lambda data, config, run: cls(), "test",
                                algorithm_cls=cls)


def test_a_half_defined_hook_is_refused_at_registration():

  class HalfStreamed(_Core):

    def evaluate_server(self, server_state, client_indices, seeds, test_data):
      return []

  with pytest.raises(TypeError, match=r"evaluate_server.*SupportsStreamedEvaluation.*"
                     r"evaluate_clients.*mt_cacheable"):
    registry.register(_spec("half_streamed_test", HalfStreamed))
  assert "half_streamed_test" not in registry.names()


def test_hooks_are_listed_and_seen_by_isinstance():

  class WithBytes(_Core):

    def round_bytes(self, num_selected, metrics):
      return num_selected, num_selected

  spec = _spec("with_bytes_test", WithBytes)
  assert spec.hooks == (base.ReportsRoundBytes,)
  assert isinstance(WithBytes(), base.ReportsRoundBytes)
  assert not isinstance(WithBytes(), base.SupportsExport)
  assert isinstance(WithBytes(), base.FederatedAlgorithm)


def test_the_shipped_algorithms_declare_their_hooks():
  import tfbfl.algorithms  # noqa: F401  pylint: disable=g-import-not-at-top  (registers them)

  hooks = {s.name: set(s.hooks) for s in registry.specs()}
  for name in ("virtual", "fedavg", "fedprox", "fedpa", "fola", "laplace_offline"):
    assert base.SupportsLearningProcess in hooks[name], name
  for name in ("virtual", "fedavg", "fedprox", "fedpa", "fola", "fedcurv", "local", "global"):
    assert base.SupportsExport in hooks[name], name
  assert base.SupportsTwoPhase in hooks["virtual"] and base.ReportsDiagnostics in hooks["virtual"]
  assert base.SupportsLearningProcess not in hooks["local"]
