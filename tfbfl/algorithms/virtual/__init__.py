"""VIRTUAL: variational federated multi-task learning as TFF computations.

Model (Corinzia, Beuret & Buhmann, "Variational Federated Multi-Task Learning",
Algorithm 1, Proposition 1, eq. 3). Shared (server) weights `theta` with posterior
proxy `s(theta) = prod_i s_i(theta)`, private client weights `phi_i` with posterior
`c_i(phi_i)`, all mean-field Gaussians held in natural parameters
(`tfbfl.gaussian`). In round t each selected client i forms its cavity `cav_i =
s^(t) / s_i^(t-1)`, trains `q_i(theta) = s_i(theta) * cav_i` and `c_i(phi_i)` for E
epochs of SGD on eq. (3) per example,

    CE(y, client(x)) [+ w_S CE(y, server(x))]
      + beta / N_i * [KL(q_i || p^(1/K) cav_i) + KL(c_i || p(phi_i))],

and sends `Delta_i = s_i^new / s_i^(t-1)`, `s_i^new = q_i / cav_i`. The server only
receives `Delta = prod_i Delta_i` and applies `s^(t+1) = s^(t) * Delta^alpha`; the
client keeps `s_i <- s_i^(t-1) * Delta_i^alpha` (damped EP, one step alpha for both,
so `s` stays the product of the stored factors). Information of clients not
selected stays in `s` (no averaging).

Modules: `config` (settings and state types; no TensorFlow), `model` (networks,
initial states, likelihood), `client` (one client's round), `step` (the lean
flat-vector step of the MLP), `keras_step` (SGD through the Keras layers),
`evaluation` (metrics S and MT), `algorithm` (`VirtualAlgorithm`, the TFF wiring).
Design, the choices made explicit and the measurements behind the defaults:
docs/virtual.md.
"""

from tfbfl.algorithms import registry
from tfbfl.algorithms.virtual.algorithm import build
from tfbfl.algorithms.virtual.algorithm import VirtualAlgorithm
from tfbfl.algorithms.virtual.client import client_update
from tfbfl.algorithms.virtual.client import client_update_batch
from tfbfl.algorithms.virtual.client import conjugate_linear_posterior
from tfbfl.algorithms.virtual.model import batched
from tfbfl.algorithms.virtual.config import ClientOutput
from tfbfl.algorithms.virtual.config import ClientState
from tfbfl.algorithms.virtual.config import default_step
from tfbfl.algorithms.virtual.config import ServerState
from tfbfl.algorithms.virtual.config import VirtualConfig
from tfbfl.algorithms.virtual.evaluation import evaluate_client
from tfbfl.algorithms.virtual.evaluation import evaluate_own_client
from tfbfl.algorithms.virtual.evaluation import evaluate_server_client
from tfbfl.algorithms.virtual.keras_step import assign_natural_precision_step
from tfbfl.algorithms.virtual.model import build_networks
from tfbfl.algorithms.virtual.model import data_loss
from tfbfl.algorithms.virtual.model import flatten_for_mlp
from tfbfl.algorithms.virtual.model import initial_client_state
from tfbfl.algorithms.virtual.model import initial_posterior

__all__ = [
    "ClientOutput",
    "ClientState",
    "ServerState",
    "VirtualAlgorithm",
    "VirtualConfig",
    "assign_natural_precision_step",
    "batched",
    "build",
    "build_networks",
    "client_update",
    "client_update_batch",
    "conjugate_linear_posterior",
    "data_loss",
    "default_step",
    "evaluate_client",
    "evaluate_own_client",
    "evaluate_server_client",
    "flatten_for_mlp",
    "initial_client_state",
    "initial_posterior",
]

registry.register(
    registry.AlgorithmSpec(
        "virtual", VirtualConfig, build, "VIRTUAL (Corinzia et al.): variational federated "
        "multi-task learning, server + private client Bayesian networks.",
        algorithm_cls=VirtualAlgorithm))
