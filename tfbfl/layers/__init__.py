"""Bayesian Keras layers: mean-field Gaussian posteriors, natural-parameter priors.

* `BayesianDense`      dense layer, local reparameterization, closed-form KL.
* `LateralConnection`  gated Bayesian adapter from a server to a client layer (VIRTUAL).
* `MeanFieldGaussianLayer` the base class new Bayesian layers subclass.
"""

from tfbfl.layers.base import MeanFieldGaussianLayer
from tfbfl.layers.dense import BayesianDense
from tfbfl.layers.lateral import LateralConnection

__all__ = ["BayesianDense", "LateralConnection", "MeanFieldGaussianLayer"]
