"""The algorithms a launcher can name: one `AlgorithmSpec` each.

An algorithm module registers itself at import (`tfbfl/algorithms/__init__.py`
imports every such module):

    registry.register(registry.AlgorithmSpec(
        name="fedpa", config_cls=FedPAConfig, build=build,
        summary="Federated posterior averaging (Al-Shedivat et al., 2021)."))

`config_cls` is a dataclass whose `tfbfl.options` fields are the algorithm's flags
(defaults, help texts and checks live there and nowhere else); `build(data, config,
run)` returns an object satisfying `tfbfl.algorithms.base.FederatedAlgorithm`, given
the `FederatedData`, the config (flag values plus the data's shapes and the run's seed and C, see
`model_fields`) and the driver's `RunConfig` (for settings derived from the run, such
as VIRTUAL's step 1/clients_per_round). `fixed` pins config fields for this name
(FedAvg is FedProx with `mu = 0`). `algorithm_cls` names the class `build`
returns; its optional hooks (`base.OPTIONAL_HOOKS`) are checked here. This
module imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from tfbfl import options
from tfbfl.algorithms import base

_SPECS: Dict[str, "AlgorithmSpec"] = {}


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  name: str
  config_cls: type
  build: Callable[[Any, Any, Any], Any]
  summary: str
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # The class `build` returns: its optional hooks are checked at registration
  # (`base.check_hooks`) and listed by `hooks`.
  algorithm_cls: Optional[type] = None
  # Refusals of flag values this algorithm cannot take (one ValueError naming the
  # flag), run by `tfbfl.driver.resolve_params` before any data or TFF.
  check_params: Optional[Callable[[Mapping[str, Any]], None]] = None

  @property
  def hooks(self) -> Tuple[type, ...]:
    return () if self.algorithm_cls is None else base.check_hooks(self.algorithm_cls)

  def make_config(self, params: Mapping[str, Any], data, model=None):
    """The config from flag values `params` and `data`'s shapes (`model_fields`);
    `model`, the checked `tfbfl.models.ModelTemplate` of `--model`, replaces the
    flag's string."""
    fixed = dict(model_fields(data, params), **self.fixed)
    if model is not None:
      fixed["model"] = model
    return options.from_flags(self.config_cls, params, **fixed)


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
  if spec.name in _SPECS and _SPECS[spec.name] != spec:
    raise ValueError(f"algorithm {spec.name!r} is registered twice.")
  spec.hooks  # pylint: disable=pointless-statement  (raises on a half-defined hook)
  _SPECS[spec.name] = spec
  return spec


def get(name: str) -> AlgorithmSpec:
  if name not in _SPECS:
    raise ValueError(f"--algorithm must be one of {names()}, got {name!r}.")
  return _SPECS[name]


def names() -> Tuple[str, ...]:
  return tuple(sorted(_SPECS))


def specs() -> Tuple[AlgorithmSpec, ...]:
  return tuple(_SPECS[n] for n in names())


def model_fields(data, params: Mapping[str, Any]) -> Dict[str, Any]:
  """Config fields taken from the data and the run (a config keeps those it has): the
  shapes, K, the clients' training examples N, and the run's `seed` and
  `clients_per_round` (VIRTUAL's step is 1/C)."""
  out = dict(input_dim=int(np.prod(data.input_shape)),
             input_shape=tuple(data.input_shape),
             num_classes=int(data.num_classes),
             num_clients=len(data.client_ids),
             num_train_examples=int(sum(len(y) for _, y in data.train.values())),
             seed=int(params.get("seed", 0)))
  if params.get("clients_per_round") is not None:
    out["clients_per_round"] = int(params["clients_per_round"])
  return out
