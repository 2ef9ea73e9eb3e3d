"""Network definitions, one module per family.

* `tfbfl.networks.base`  machinery shared by the laterally connected families
  (layer plans, initial values, the `LateralNetworks` base class).
* `tfbfl.networks.mlp`   VIRTUAL's Bayesian MLPs and the deterministic MLP.
* `tfbfl.networks.conv`  VIRTUAL's conv networks, the deterministic conv net and
  FOLA's McMahan et al. CIFAR-10 CNN.
* `tfbfl.networks.lstm`  VIRTUAL's LSTM networks and the deterministic LSTM.

Every laterally connected network (`VirtualNetworks`, `VirtualConvNetworks`,
`VirtualLSTMNetworks`) is a `LateralNetworks` with the same interface (`forward`,
`server_logits`, `client_logits`, `shared_posterior`, `set_shared_posterior`,
`shared_prior`, `set_shared_prior`, `kl_shared`, `kl_private`,
`shared_trainable_variables`, `private_trainable_variables`, `get_private_weights`,
`set_private_weights`), so the VIRTUAL algorithm can use any of them through a
builder.
"""

from tfbfl.networks.base import LateralNetworks
from tfbfl.networks.conv import (
    VirtualConvNetworks,
    build_deterministic_conv,
    build_mcmahan_cnn,
    initial_private_weights_conv,
    initial_shared_posterior_conv,
)
from tfbfl.networks.lstm import (
    DEFAULT_VOCAB_SIZE,
    VirtualLSTMNetworks,
    build_deterministic_lstm,
    initial_private_weights_lstm,
    initial_shared_posterior_lstm,
)
from tfbfl.networks.mlp import (
    VirtualNetworks,
    build_deterministic_mlp,
    initial_private_weights,
    initial_shared_posterior,
)

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "LateralNetworks",
    "VirtualConvNetworks",
    "VirtualLSTMNetworks",
    "VirtualNetworks",
    "build_deterministic_conv",
    "build_deterministic_lstm",
    "build_deterministic_mlp",
    "build_mcmahan_cnn",
    "initial_private_weights",
    "initial_private_weights_conv",
    "initial_private_weights_lstm",
    "initial_shared_posterior",
    "initial_shared_posterior_conv",
    "initial_shared_posterior_lstm",
]
