"""Deprecated: moved to tfbfl.networks.conv and tfbfl.networks.lstm; kept so
existing imports work.

Import from `tfbfl.networks` (or its family modules) in new code.
"""

from tfbfl.networks.conv import (
    VirtualConvNetworks,
    build_deterministic_conv,
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

__all__ = [
    "DEFAULT_VOCAB_SIZE",  # public before the move too (then outside `__all__`)
    "VirtualConvNetworks",
    "VirtualLSTMNetworks",
    "build_deterministic_conv",
    "build_deterministic_lstm",
    "initial_private_weights_conv",
    "initial_private_weights_lstm",
    "initial_shared_posterior_conv",
    "initial_shared_posterior_lstm",
]
