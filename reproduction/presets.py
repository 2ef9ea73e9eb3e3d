"""Named settings of the papers' experiments (dataset rows and their networks).

Each preset is a dict of `tfbfl.driver` parameters; launchers and the Table II
grid accept a preset name wherever they accept a dataset spec, and explicit flags
override it. Sources: VIRTUAL Table I/II, Sec. IV-A/B and App. D (C = 10 clients
per round, E = 20, B = 20, Shakespeare B = 10, MLP 2x100, FEMNIST conv net,
2-layer LSTM), FOLA Sec. 4, PFNM Sec. 4.
"""

from __future__ import annotations

from typing import Any, Dict

_VIRTUAL = dict(clients_per_round=10, epochs_per_round=20, batch_size=20)

PRESETS: Dict[str, Dict[str, Any]] = {
    # VIRTUAL Table II rows (need the files described in data/README.md).
    "femnist_mlp":
        dict(dataset="femnist", num_clients=100, architecture="mlp", **_VIRTUAL),
    "femnist_conv":
        dict(dataset="femnist",
             num_clients=100,
             architecture="conv",
             image_shape=(28, 28),
             **_VIRTUAL),
    "mnist":
        dict(dataset="mnist", partition="homogeneous", num_clients=100, **_VIRTUAL),
    "pmnist":
        dict(dataset="pmnist", num_clients=100, **_VIRTUAL),
    "vsn":
        dict(dataset="vsn", num_clients=23, **_VIRTUAL),
    "har":
        dict(dataset="har", num_clients=30, **_VIRTUAL),
    "shakespeare":
        dict(dataset="shakespeare",
             num_clients=100,
             architecture="lstm",
             **dict(_VIRTUAL, batch_size=10)),
    # Bundled stand-ins (no files needed): the three heterogeneity regimes.
    "digits_iid":
        dict(dataset="digits", partition="homogeneous", num_clients=10, clients_per_round=10),
    "digits_dirichlet":
        dict(dataset="digits", partition="class_dirichlet", num_clients=10, clients_per_round=10),
    "digits_permuted":
        dict(dataset="digits", partition="permuted", num_clients=10, clients_per_round=10),
}


def preset(name: str) -> Dict[str, Any]:
  """A copy of the named preset; ValueError listing the names otherwise."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}.")
  return dict(PRESETS[name])
