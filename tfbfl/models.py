"""Deprecated: moved to tfbfl.networks.mlp (and `build_mcmahan_cnn` to
tfbfl.networks.conv); kept so existing imports work.

Import from `tfbfl.networks` (or its family modules) in new code.
"""

from tfbfl.networks.conv import build_mcmahan_cnn
from tfbfl.networks.mlp import (
    VirtualNetworks,
    build_deterministic_mlp,
    initial_private_weights,
    initial_shared_posterior,
)

__all__ = [
    "VirtualNetworks",
    "build_deterministic_mlp",
    "initial_private_weights",
    "initial_shared_posterior",
    "build_mcmahan_cnn",
]
