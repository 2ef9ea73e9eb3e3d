"""Bayesian Keras layers: mean-field Gaussian posteriors, natural-parameter priors.

* `BayesianDense`      dense layer, local reparameterization, closed-form KL.
* `BayesianConv2D`     2-D convolution, local reparameterization, closed-form KL.
* `BayesianLSTM`       LSTM, one weight draw per call shared across time steps.
* `GaussianEmbedding`  embedding table of diagonal Gaussians, one draw per lookup.
* `LateralConnection`  gated Bayesian adapter from a server to a client layer (VIRTUAL).
* `MeanFieldGaussianLayer` the base class new Bayesian layers subclass.

All are ordinary Keras layers, registered for serialization (package `tfbfl`: a
saved `.keras` or `.h5` model reloads without `custom_objects`). In a Keras
`fit` they sample (training mode) and add `kl_weight * KL(q || p)` to the loss
(or a TFP-style `divergence_fn`); set `kl_weight = 1 / num_train_examples` for
the per-example ELBO. The default weight is 1 and calls without `training` or
`seed` use the posterior mean, as tfbfl's federated algorithms expect.

`to_bayesian(model)` builds the Bayesian copy of a Keras `Sequential` model or
functional chain (`Dense`, `Conv2D`, `LSTM`, `Embedding` replaced, weightless layers
carried over); `bayesian_layer_args` and `is_weightless` are its per-layer decisions.
"""

from tfbfl.layers.base import MeanFieldGaussianLayer
from tfbfl.layers.conv import BayesianConv2D
from tfbfl.layers.convert import (
    SUPPORTED_WEIGHT_LAYERS,
    WEIGHTLESS_LAYERS,
    UnsupportedLayerError,
    bayesian_layer_args,
    is_weightless,
    to_bayesian,
)
from tfbfl.layers.dense import BayesianDense
from tfbfl.layers.lateral import LateralConnection
from tfbfl.layers.recurrent import BayesianLSTM, GaussianEmbedding

__all__ = [
    "BayesianConv2D",
    "BayesianDense",
    "BayesianLSTM",
    "GaussianEmbedding",
    "LateralConnection",
    "MeanFieldGaussianLayer",
    "SUPPORTED_WEIGHT_LAYERS",
    "UnsupportedLayerError",
    "WEIGHTLESS_LAYERS",
    "bayesian_layer_args",
    "is_weightless",
    "to_bayesian",
]
