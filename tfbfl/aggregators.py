"""`tff.aggregators` factories over Gaussian factors in natural parameters.

A mean-field Gaussian factor travels as `NaturalGaussian(eta1, eta2)` with
`eta1 = mu * prec` and `eta2 = prec`. In these coordinates the algebra the server
needs is linear:

* product of factors  `prod_i t_i`            = `sum_i eta(t_i)`            (VIRTUAL:
  the aggregate update `Delta = prod_{i in C_t} Delta_i`);
* tempered product    `prod_n t_n^(a_n)`, with `a_n = w_n / sum_m w_m`
                                              = `sum_n a_n eta(t_n)`        (FOLA: the
  precision-weighted mean `Lambda_S = sum a_n Lambda_n`,
  `mu_S = Lambda_S^-1 sum a_n Lambda_n mu_n`).

So both are plain federated sums / weighted means of the natural parameters, and
`GaussianProductFactory` is *composed* of TFF's own factories, exactly like
`tff.aggregators.MeanFactory` is composed of its `value_sum_factory`: pass a secure
or differentially private sum as `value_sum_factory` and Gaussian factors are
aggregated with it, unchanged. Only the aggregate ever reaches the server.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow_federated as tff

_FIELDS = ("eta1", "eta2")


def _check_natural_type(value_type) -> None:
  """Raises TypeError unless `value_type` is a struct `<eta1=T, eta2=T>` of floats."""
  if not isinstance(value_type, tff.StructType):
    raise TypeError(
        "GaussianProductFactory expects a struct <eta1=..., eta2=...> of natural "
        f"parameters (a tfbfl.gaussian.NaturalGaussian), got {value_type}.")
  names = tuple(name for name, _ in tff.structure.iter_elements(value_type))
  if names != _FIELDS:
    raise TypeError(
        f"GaussianProductFactory expects fields {_FIELDS}, got {names} in {value_type}.")
  eta1, eta2 = value_type.eta1, value_type.eta2
  if not eta1.is_equivalent_to(eta2):
    raise TypeError(
        f"eta1 and eta2 must have the same structure and shapes, got {eta1} and {eta2}.")
  for leaf in _leaves(value_type):
    if not np.issubdtype(leaf.dtype, np.floating):
      raise TypeError(f"natural parameters must be floating point, got {leaf}.")


def _leaves(type_spec):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  elif isinstance(type_spec, tff.StructType):
    for _, element in tff.structure.iter_elements(type_spec):
      yield from _leaves(element)
  else:
    raise TypeError(f"natural parameters must be tensors, got {type_spec}.")


class GaussianProductFactory(tff.aggregators.UnweightedAggregationFactory,
                             tff.aggregators.WeightedAggregationFactory):
  """Aggregates Gaussian factors (natural parameters) placed at CLIENTS.

  Unweighted (`weighted=False`, VIRTUAL): the server receives the product of the
  client factors,

      eta(prod_i t_i) = sum_i eta(t_i),

  computed by `value_sum_factory` (default `tff.aggregators.SumFactory()`).

  Weighted (`weighted=True`, FOLA's Gaussian product): with client weights `w_n`
  (e.g. example counts) the server receives the tempered product
  `prod_n t_n^(a_n)`, `a_n = w_n / sum_m w_m`:

      Lambda_S = sum_n a_n Lambda_n,   Lambda_S mu_S = sum_n a_n Lambda_n mu_n,

  computed by `tff.aggregators.MeanFactory(value_sum_factory=...)`. The mean
  `mu_S` is invariant to multiplying every client's precision by a common
  constant; the caller converts with `tfbfl.gaussian.mean`, which is where a zero
  aggregate precision must be handled (see `tfbfl.algorithms.fola`).

  #### Examples

  ```python
  factory = GaussianProductFactory()                # VIRTUAL: product of deltas
  process = factory.create(delta_type)              # a tff.templates.AggregationProcess
  fola = GaussianProductFactory(weighted=True)      # FOLA: precision-weighted mean
  process = fola.create(posterior_type, tff.TensorType(np.float32))
  ```

  Args:
    weighted: whether `create` takes a weight type (tempered product) or not.
    value_sum_factory: inner `UnweightedAggregationFactory` that sums the natural
      parameters (secure/DP sums plug in here).
  """

  def __init__(self, weighted: bool = False,
               value_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None):
    if value_sum_factory is not None and not isinstance(
        value_sum_factory, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
          "value_sum_factory must be a tff.aggregators.UnweightedAggregationFactory, "
          f"got {type(value_sum_factory).__name__}.")
    self._weighted = weighted
    self._value_sum_factory = value_sum_factory or tff.aggregators.SumFactory()

  @property
  def weighted(self) -> bool:
    return self._weighted

  @property
  def value_sum_factory(self) -> tff.aggregators.UnweightedAggregationFactory:
    """The inner factory that sums the natural parameters."""
    return self._value_sum_factory

  def create(self, value_type, weight_type=None) -> tff.templates.AggregationProcess:
    _check_natural_type(value_type)
    if self._weighted:
      if weight_type is None:
        raise TypeError("a weighted GaussianProductFactory needs a weight_type.")
      mean = tff.aggregators.MeanFactory(value_sum_factory=self._value_sum_factory)
      return mean.create(value_type, weight_type)
    if weight_type is not None:
      raise TypeError("an unweighted GaussianProductFactory takes no weight_type.")
    return self._value_sum_factory.create(value_type)
