"""Shared machinery of the mean-field Gaussian layers.

`MeanFieldGaussianLayer` holds everything a Bayesian layer with a diagonal Gaussian
posterior and a diagonal Gaussian prior needs: variable creation, the
scale transform, conversion to and from natural parameters (`tfbfl.gaussian`), the
closed-form KL divergence and its registration, weighted by `kl_weight` or replaced
by a TFP-style `divergence_fn`, as a *callable* Keras loss, sampling in Keras'
training mode, argument validation and `get_config`/`from_config`. A concrete
layer only says which parameters it has (`_parameter_shapes`) and how an input
meets them (`_apply_variational`).

The helpers `initial_loc`, `initial_untransformed_scale` and `scale_from_untransformed`
are public so that initial values can be computed without building a layer (the
federated driver needs initial server and client states outside any Keras model);
they are the functions the layers themselves use, so both agree bit for bit.

`example_keyed_noise(keys)` is an evaluation option: inside it a sampled pass draws
each example's noise from its own key (`example_keys` of its features) instead of
one draw over the batch, so the pass is a function of (weights, seed, example)
whatever else is in the batch. Training never enters it.
"""

import contextlib
import importlib
import threading
import types

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbfl import gaussian

__all__ = [
    "MeanFieldGaussianLayer",
    "check_divergence_args",
    "check_finite_float",
    "check_natural_gaussian",
    "check_positive_int",
    "check_seed",
    "derive_seed",
    "deserialize_divergence_fn",
    "example_keyed_noise",
    "example_keys",
    "fresh_seed",
    "initial_loc",
    "is_int",
    "initial_untransformed_scale",
    "keyed_normal",
    "scale_from_untransformed",
    "serialize_divergence_fn",
]

tfd = tfp.distributions

_TRUNCATED_NORMAL_STDDEV_CORRECTION = 0.87962566103423978  # std of N(0,1) cut at +-2


def is_int(value):
  """True for Python and numpy integers, False for bools (which are ints too)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_positive_int(name, value):
  """`int(value)` if `value` is a positive (Python or numpy) int, else ValueError."""
  if not is_int(value) or value <= 0:
    raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
  return int(value)


def check_finite_float(name, value):
  """`float(value)`; ValueError unless it converts to a finite float."""
  try:
    value = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"`{name}` must be a float, got {value!r}.") from None
  if not np.isfinite(value):
    raise ValueError(f"`{name}` must be finite, got {value!r}.")
  return value


def check_seed(seed):
  """`int(seed)`, or `None` for `None`; ValueError for anything but an int."""
  if seed is not None and not is_int(seed):
    raise ValueError(f"`seed` must be a Python int or None, got {seed!r}.")
  return None if seed is None else int(seed)


def check_natural_gaussian(g, name):
  """`(list(g.eta1), list(g.eta2))`; ValueError unless `g` is a `NaturalGaussian`."""
  if not (hasattr(g, "eta1") and hasattr(g, "eta2")):
    raise ValueError(f"`{name}` must be a tfbfl.gaussian.NaturalGaussian, got "
                     f"{type(g).__name__}.")
  return list(g.eta1), list(g.eta2)


def derive_seed(seed, *salt):
  """Derives a non-negative 31-bit integer seed from `seed` and integer `salt`s.

  Pure Python/numpy (`np.random.SeedSequence`), so it is usable at graph-construction
  time anywhere (inside `tf.function` or a TFF computation) and is deterministic.
  """
  if seed is None:
    return None
  seed = check_seed(seed)
  entropy = [int(seed) % (2**32)] + [int(s) % (2**32) for s in salt]
  return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


def initial_loc(shape, fan_in, fan_out, seed=None, dtype=tf.float32):
  """Glorot-normal initial posterior mean.

  A normal truncated at two standard deviations with variance
  `2 / (fan_in + fan_out)` after truncation. With an integer `seed` the draw is a
  stateless op on seed `[seed, 0]` (deterministic, allowed inside TFF); a `[2]`
  int64 tensor `seed` is that stateless seed itself; with `None` it is an ordinary
  unseeded draw.
  """
  stddev = np.sqrt(2.0 / max(1.0, float(fan_in + fan_out)))
  stddev /= _TRUNCATED_NORMAL_STDDEV_CORRECTION
  if seed is None:
    return tf.random.truncated_normal(shape, stddev=stddev, dtype=dtype)
  if not tf.is_tensor(seed):
    seed = tf.constant([seed, 0], tf.int64)
  return tf.random.stateless_truncated_normal(shape, seed=seed, stddev=stddev, dtype=dtype)


def initial_untransformed_scale(init_scale, min_scale):
  """The `u` with `softplus(u) + min_scale == init_scale` (a Python float).

  Computed in numpy (`x + log(-expm1(-x))`, stable for small and large `x`), so it
  is a constant in any graph.
  """
  x = float(init_scale) - float(min_scale)
  if not x > 0:
    raise ValueError(f"`init_scale` must exceed `min_scale`, got {init_scale} <= {min_scale}.")
  return float(x + np.log(-np.expm1(-x)))


def scale_from_untransformed(untransformed_scale, min_scale):
  """`sigma = softplus(u) + min_scale`: positive, smooth, floored at `min_scale`."""
  return tf.nn.softplus(untransformed_scale) + min_scale


def _check_positive(name, value, allow_zero=False):
  try:
    value = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"`{name}` must be a number, got {value!r}.") from None
  if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
    relation = ">= 0" if allow_zero else "> 0"
    raise ValueError(f"`{name}` must be finite and {relation}, got {value!r}.")
  return value


def check_divergence_args(kl_weight, divergence_fn):
  """`(kl_weight, divergence_fn)` validated: at most one of them is not `None`.

  `kl_weight` must be `None` or a finite number `>= 0` (returned as a Python
  float); `divergence_fn` must be `None` or a callable `(q, p, _) -> scalar`.
  ValueError otherwise, naming the argument.
  """
  if kl_weight is not None:
    if isinstance(kl_weight, (bool, np.bool_)) or tf.is_tensor(kl_weight) or isinstance(
        kl_weight, tf.Variable):
      raise ValueError(f"`kl_weight` must be a Python float >= 0 or None, got {kl_weight!r}.")
    kl_weight = _check_positive("kl_weight", kl_weight, allow_zero=True)
  if divergence_fn is not None and not callable(divergence_fn):
    raise ValueError("`divergence_fn` must be a callable `(q, p, _) -> scalar` or None, got "
                     f"{divergence_fn!r}.")
  if kl_weight is not None and divergence_fn is not None:
    raise ValueError("Pass at most one of `kl_weight` and `divergence_fn` (a `divergence_fn` "
                     "sets the whole loss term; fold any weight into it), got "
                     f"kl_weight={kl_weight!r} and divergence_fn={divergence_fn!r}.")
  return kl_weight, divergence_fn


def serialize_divergence_fn(divergence_fn):
  """`divergence_fn` as a JSON-friendly value for `get_config`.

  * `None` stays `None`;
  * a function registered with `tf.keras.utils.register_keras_serializable`
    becomes its registered name (`"package>name"`): reloads anywhere it is
    registered, or with `custom_objects`;
  * another module-level function becomes `{"module": ..., "function": ...}`:
    reloads wherever its module can be imported;
  * anything else (a `lambda`, a closure, a Keras-serializable object) is left to
    `tf.keras.saving.serialize_keras_object`; a `lambda` is stored as bytecode and
    reloads only with `safe_mode=False`, as in Keras' own `Lambda` layer.

  The format does not depend on Keras' saving mode, so `.keras` and `.h5` files
  store the same value.
  """
  if divergence_fn is None:
    return None
  try:
    registered = tf.keras.utils.get_registered_name(divergence_fn)
  except (AttributeError, TypeError):  # e.g. a functools.partial: no __name__
    registered = None
  if registered is not None and registered != getattr(divergence_fn, "__name__", None):
    return registered
  module = getattr(divergence_fn, "__module__", None)
  qualname = getattr(divergence_fn, "__qualname__", "")
  if isinstance(divergence_fn, types.FunctionType) and module and "<" not in qualname:
    return {"module": module, "function": qualname}
  return tf.keras.saving.serialize_keras_object(divergence_fn)


def deserialize_divergence_fn(config):
  """Inverse of `serialize_divergence_fn` (callables and `None` pass through)."""
  if config is None or callable(config):
    return config
  if isinstance(config, str):
    registered = tf.keras.utils.get_registered_object(config)
    if registered is None:
      raise ValueError(f"Unknown `divergence_fn` {config!r}: register it with "
                       "`tf.keras.utils.register_keras_serializable` or pass it in "
                       "`custom_objects`.")
    return registered
  if isinstance(config, dict) and set(config) == {"module", "function"}:
    try:
      obj = importlib.import_module(config["module"])
      for part in config["function"].split("."):
        obj = getattr(obj, part)
    except (ImportError, AttributeError):
      raise ValueError(f"Cannot find `divergence_fn` {config['function']!r} in module "
                       f"{config['module']!r}.") from None
    return obj
  return tf.keras.saving.deserialize_keras_object(config)


# -- example-keyed noise (an evaluation option) -------------------------------------
#
# A sampled pass normally draws `stateless_normal(shape, seed)` over the whole batch,
# so an example's noise depends on its row and on the batch's size. Inside
# `example_keyed_noise(keys)` row b's noise is a function of (seed, keys[b], the
# element's index within the row) alone: a counter-based hash (the `lowbias32`
# mixer, C. Wellons' hash-prospector, a bijection of uint32) gives 23 uniform bits
# per element, turned into a normal by the inverse CDF (`tf.math.ndtri`; |e| < 5.3).
# Integer ops up to the last step, and each element on its own: exact whatever the batch.

_MIX1, _MIX2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
_GOLDEN = 0x9E3779B9  # odd: `i * _GOLDEN` is a bijection of uint32
_KEY_SALTS = (0x2545F491, 0x61C88647)  # the two words of an example's key
_KEYS = threading.local()


def _u32(value):
  return tf.constant(value & 0xFFFFFFFF, tf.uint32)


def _mix32(h):
  """lowbias32: `h ^= h >> 16; h *= M1; h ^= h >> 15; h *= M2; h ^= h >> 16` (uint32)."""
  shift = lambda h, n: tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(n)))
  h = shift(h, 16) * _u32(_MIX1)
  h = shift(h, 15) * _u32(_MIX2)
  return shift(h, 16)


def example_keys(x):
  """Each example's key, uint32 `[n, 2]`: two hashes of the bits of row `x[b]` (its
  features, any shape after the batch axis; floats as float32 bits, with -0.0 read
  as 0.0; integers as int32). Equal rows have equal keys; a row's key does not
  depend on the other rows."""
  x = tf.convert_to_tensor(x)
  if x.dtype.is_floating:
    x = tf.cast(x, tf.float32)
    x = tf.where(tf.equal(x, 0.0), tf.zeros_like(x), x)  # -0.0 and 0.0: one key
    bits = tf.bitcast(x, tf.uint32)
  else:
    bits = tf.bitcast(tf.cast(x, tf.int32), tf.uint32)
  bits = tf.reshape(bits, [tf.shape(x)[0], -1])
  position = tf.cast(tf.range(tf.shape(bits)[1]), tf.uint32) * _u32(_GOLDEN)
  # Each feature mixed with its position, then two sums (mod 2^32) of the results:
  # plain, and weighted by an odd multiplier per position.
  mixed = _mix32(tf.bitwise.bitwise_xor(bits, _mix32(position + _u32(_KEY_SALTS[0]))))
  weights = tf.bitwise.bitwise_or(_mix32(position + _u32(_KEY_SALTS[1])), _u32(1))
  sums = (tf.reduce_sum(mixed, axis=1), tf.reduce_sum(mixed * weights, axis=1))
  return tf.stack([_mix32(h + _u32(salt)) for h, salt in zip(sums, _KEY_SALTS)], axis=1)


def keyed_normal(shape, seed, keys, dtype=tf.float32):
  """Standard normals of `shape` (`[n, ...]`) whose row b is a function of `seed`
  (a `[2]` integer tensor), `keys[b]` (`example_keys`) and the position within the
  row only: the same example gets the same noise in any batch."""
  shape = tf.convert_to_tensor(shape, tf.int32)
  # Two random words from the seed (Philox, full-range uint32) into each row's key
  # (keys are already mixed: `example_keys`); then two rounds per element.
  words = tf.random.stateless_uniform([2], seed=seed, minval=None, maxval=None, dtype=tf.uint32)
  row = tf.bitwise.bitwise_xor(tf.convert_to_tensor(keys, tf.uint32), words[None, :])
  index = tf.cast(tf.range(tf.reduce_prod(shape[1:])), tf.uint32) * _u32(_GOLDEN)
  h = _mix32(tf.bitwise.bitwise_xor(index[None, :], row[:, :1]))
  h = _mix32(h + row[:, 1:])
  return tf.cast(tf.reshape(tf.math.ndtri(_open_unit_interval(h)), shape), dtype)


def _open_unit_interval(h):
  """float32 uniforms in (0, 1) from uint32 hashes: the top 23 bits `k` as
  `(k + 0.5) / 2^23`, exact in float32, so 0 and 1 (`ndtri` = -inf, inf) never occur."""
  return (tf.cast(tf.bitwise.right_shift(h, _u32(9)), tf.float32) + 0.5) * (2.0**-23)


def _active_example_keys():
  stack = getattr(_KEYS, "stack", None)
  return stack[-1] if stack else None


@contextlib.contextmanager
def example_keyed_noise(keys):
  """Within this scope (while a pass is traced or run eagerly), every sampled
  local-reparameterization pass draws its noise with `keyed_normal(shape, seed,
  keys)`: row b's from (its seed, `keys[b]`) alone, so an example's sampled output
  does not depend on its batch. `keys`: `example_keys` of the batch the pass
  reads (one per row of every layer's output). Passes at the posterior means and
  `BayesianLSTM`'s weight draws (one per pass, shared by every row: already
  independent of the batch) are unchanged; outside the scope (training) nothing
  changes."""
  previous = getattr(_KEYS, "stack", None) or []
  _KEYS.stack = previous + [keys]
  try:
    yield
  finally:
    _KEYS.stack = previous


_MAX_SEED = 2**31 - 1


def fresh_seed():
  """A `[2]` int64 seed for the stateless samplers, new at every call.

  Drawn by an unseeded (stateful) `tf.random.uniform`: a new value at every eager
  call and at every execution of a traced graph, reproducible across runs under
  `tf.keras.utils.set_random_seed` (the same mechanism as Keras' `Dropout`). No
  variable is created, so a layer's weights and checkpoints do not change.
  """
  return tf.random.uniform([2], minval=0, maxval=_MAX_SEED, dtype=tf.int64)


class MeanFieldGaussianLayer(tf.keras.layers.Layer):
  """Base class: mean-field Gaussian posterior, Gaussian prior, closed-form KL.

  For every parameter tensor `w` (e.g. `kernel`, `bias`) the layer owns

  * trainable `w_loc` (`mu`) and `w_untransformed_scale` (`u`), with posterior
    `q(w) = N(mu, sigma^2)`, `sigma = softplus(u) + min_scale`. The floor
    `min_scale` (default `1e-6`) keeps every precision finite when the posterior
    is converted to natural parameters and keeps `u` invertible;
  * non-trainable `w_prior_eta1`, `w_prior_eta2`: the prior in natural parameters
    `(mu_p / sigma_p^2, 1 / sigma_p^2)`, initialised to `N(0, prior_scale^2)`.
    Natural parameters make any Gaussian expressible as a prior, in particular the
    tempered, cavity-multiplied priors of VIRTUAL, which are products of factors.

  `kl_divergence()` is `sum_w KL(q(w) || p(w))` in closed form
  (`tfbfl.gaussian.kl_divergence`), never weighted. `divergence_loss()` is the term
  the layer contributes to the training objective; it is registered once with
  `add_loss(lambda: self.divergence_loss())` so that `layer.losses` recomputes it in
  whatever graph asks for it. A tensor loss would be captured by the first trace
  and break the next one (TFF traces in TF1-style graphs). It is

  * `kl_weight * kl_divergence()` with `kl_weight` given;
  * `sum_w divergence_fn(q(w), p(w), None)` with `divergence_fn` given, where
    `q(w)`, `p(w)` are `tfd.Independent(tfd.Normal(...))` over the whole tensor `w`
    (the TFP layers' `kernel_divergence_fn(q, p, _)` convention, applied to every
    parameter tensor; the third argument is `None` because local
    reparameterization never materialises a weight sample, as in
    `tfp.layers.DenseLocalReparameterization`);
  * `kl_divergence()` (weight 1) when neither is given, the behaviour of earlier
    versions, which tfbfl's federated algorithms keep: they never read
    `layer.losses` but call `kl_divergence()` themselves with their own weights.

  **Which weight.** For `N` training examples `(x_n, y_n)` the evidence lower bound
  is `ELBO(q) = sum_n E_q[log p(y_n | x_n, w)] - KL(q(w) || p(w))`, i.e. per example

  ```none
  ELBO(q) / N = mean_n E_q[log p(y_n | x_n, w)] - KL(q || p) / N
  ```

  Keras minimises the batch mean of the loss plus `sum(model.losses)`. With the
  cross-entropy (`-log p(y | x, w)`) as loss, sampled outputs in training mode (a
  one-sample estimate of `E_q`) and `kl_weight = 1 / N` (as TFP's examples scale
  `kernel_divergence_fn` by the number of examples), each step's loss is an
  unbiased estimate of `-ELBO(q) / N`. With the default weight 1 the KL is counted
  `N` times over and swamps the data term (a posterior pinned to the prior).

  **Forward pass.** `call(inputs, seed=None, training=None)`:

  * `seed`, a `[2]` integer tensor: one sample, from stateless random ops on
    `seed` (equal seeds give equal outputs), whatever `training` says;
  * no `seed` and `training` true (Keras `fit`, or `model(x, training=True)`): one
    sample from a fresh seed (`fresh_seed()`), so every call and every step draws
    new noise;
  * otherwise (`training` false or unset: `predict`, `evaluate`, direct calls):
    the deterministic posterior-mean pass.

  Subclasses implement `_parameter_shapes(input_shape)`, returning an ordered list
  of `(name, shape, fan_in, fan_out, random_loc)` (the order fixes the order of
  `posterior()`), and `_apply_variational(inputs, locs, variances, seed)`, where
  `locs`/`variances` are dicts by name and `variances` is `None` for the
  deterministic (posterior-mean) forward pass.
  """

  def __init__(
      self,
      activation=None,
      prior_scale=1.0,
      init_scale=1e-3,
      min_scale=1e-6,
      variance_epsilon=1e-8,
      seed=None,
      kl_weight=None,
      divergence_fn=None,
      **kwargs,
  ):
    super().__init__(**kwargs)
    self.prior_scale = _check_positive("prior_scale", prior_scale)
    self.min_scale = _check_positive("min_scale", min_scale, allow_zero=True)
    self.init_scale = _check_positive("init_scale", init_scale)
    if self.init_scale <= self.min_scale:
      raise ValueError(f"`init_scale` must exceed `min_scale` ({self.min_scale}), "
                       f"got {init_scale!r}.")
    self.variance_epsilon = _check_positive("variance_epsilon", variance_epsilon, allow_zero=True)
    self.seed = check_seed(seed)
    self.kl_weight, self.divergence_fn = check_divergence_args(kl_weight, divergence_fn)
    self.activation = tf.keras.activations.get(activation)
    self._param_names = ()

  # -- construction ----------------------------------------------------------------

  def _parameter_shapes(self, input_shape):
    raise NotImplementedError

  def _known_last_dim(self, input_shape, axes):
    """The last dimension of `input_shape`, which must have rank `len(axes)` (the
    axes' names, for the error) and a known last dimension; the input spec is
    fixed to that rank and last dimension."""
    if input_shape.rank != len(axes) or input_shape[-1] is None:
      raise ValueError(f"`input_shape` must be [{', '.join(axes)}] with known {axes[-1]}, got "
                       f"{input_shape}.")
    last = int(input_shape[-1])
    self.input_spec = tf.keras.layers.InputSpec(ndim=len(axes), axes={-1: last})
    return last

  def build(self, input_shape):
    specs = self._parameter_shapes(tf.TensorShape(input_shape))
    u0 = initial_untransformed_scale(self.init_scale, self.min_scale)
    prior_eta2 = 1.0 / self.prior_scale**2
    names = []
    for index, (name, shape, fan_in, fan_out, random_loc) in enumerate(specs):
      if random_loc:
        seed = derive_seed(self.seed, index)
        loc_init = lambda shape, dtype, fi=fan_in, fo=fan_out, s=seed: (initial_loc(
            shape, fi, fo, seed=s, dtype=dtype))
      else:
        loc_init = tf.keras.initializers.Zeros()
      loc = self.add_weight(name=f"{name}_loc", shape=shape, initializer=loc_init, trainable=True)
      u = self.add_weight(
          name=f"{name}_untransformed_scale",
          shape=shape,
          initializer=tf.keras.initializers.Constant(u0),
          trainable=True,
      )
      eta1 = self.add_weight(
          name=f"{name}_prior_eta1",
          shape=shape,
          initializer=tf.keras.initializers.Zeros(),
          trainable=False,
      )
      eta2 = self.add_weight(
          name=f"{name}_prior_eta2",
          shape=shape,
          initializer=tf.keras.initializers.Constant(prior_eta2),
          trainable=False,
      )
      setattr(self, f"{name}_loc", loc)
      setattr(self, f"{name}_untransformed_scale", u)
      setattr(self, f"{name}_prior_eta1", eta1)
      setattr(self, f"{name}_prior_eta2", eta2)
      names.append(name)
    self._param_names = tuple(names)
    self.add_loss(lambda: self.divergence_loss())
    super().build(input_shape)

  # -- forward ---------------------------------------------------------------------

  def _apply_variational(self, inputs, locs, variances, seed):
    raise NotImplementedError

  def _local_reparameterization(self, linear, inputs, locs, variances, seed, square_inputs=True):
    """`_apply_variational` of a layer whose output is linear in its parameters.

    `linear(inputs, params)` computes the output from a dict of parameter tensors.
    The output's mean is `linear(inputs, locs)` and its variance
    `linear(inputs^2, variances)` (`linear(inputs, variances)` with
    `square_inputs=False`, for inputs that are their own squares, such as lookups);
    with `variances` set, one draw
    `mean + sqrt(variance + variance_epsilon) * e`, `e ~ N(0, I)` from
    `tf.random.stateless_normal(seed)`, is returned, otherwise the mean. Inside
    `example_keyed_noise(keys)` `e` is `keyed_normal(shape, seed, keys)` instead:
    row b's noise from (seed, keys[b]) alone.
    """
    mean = linear(inputs, locs)
    if variances is None:
      return mean
    variance = linear(tf.square(inputs) if square_inputs else inputs, variances)
    keys = _active_example_keys()
    if keys is None:  # training, and any pass outside `example_keyed_noise`
      noise = tf.random.stateless_normal(tf.shape(mean), seed=seed, dtype=mean.dtype)
    else:
      noise = keyed_normal(tf.shape(mean), seed, keys, dtype=mean.dtype)
    return mean + tf.sqrt(variance + self.variance_epsilon) * noise

  def call(self, inputs, seed=None, training=None):
    if seed is not None:
      return self._forward(inputs, seed)
    if training is None:
      return self._forward(inputs, None)
    if isinstance(training, (bool, np.bool_, int, np.integer)):
      return self._forward(inputs, fresh_seed() if training else None)
    static = tf.get_static_value(training)
    if static is not None:
      return self._forward(inputs, fresh_seed() if bool(static) else None)
    return tf.cond(tf.cast(training, tf.bool), lambda: self._forward(inputs, fresh_seed()),
                   lambda: self._forward(inputs, None))

  def _forward(self, inputs, seed):
    """The sampled (`seed` a `[2]` tensor) or posterior-mean (`None`) forward pass."""
    locs = {n: getattr(self, f"{n}_loc") for n in self._param_names}
    variances = None
    if seed is not None:
      variances = {
          n:
              tf.square(
                  scale_from_untransformed(getattr(self, f"{n}_untransformed_scale"),
                                           self.min_scale)) for n in self._param_names
      }
    outputs = self._apply_variational(inputs, locs, variances, seed)
    if self.activation is not None:
      outputs = self.activation(outputs)
    return outputs

  # -- distributions ---------------------------------------------------------------

  def _check_built(self, method):
    if not self.built:
      raise ValueError(f"{type(self).__name__}.{method}() needs a built layer; call "
                       "`layer.build(input_shape)` first.")

  @property
  def parameter_names(self):
    """Names of the parameter tensors, in the order used by `posterior()`."""
    return self._param_names

  @property
  def posterior_variables(self):
    """The trainable variables `[w_loc, w_untransformed_scale, ...]` by parameter."""
    return [
        getattr(self, f"{n}_{kind}")
        for n in self._param_names
        for kind in ("loc", "untransformed_scale")
    ]

  def posterior_loc_scale(self):
    """`(locs, scales)`: lists over `parameter_names`."""
    self._check_built("posterior_loc_scale")
    locs = [tf.convert_to_tensor(getattr(self, f"{n}_loc")) for n in self._param_names]
    scales = [
        scale_from_untransformed(getattr(self, f"{n}_untransformed_scale"), self.min_scale)
        for n in self._param_names
    ]
    return locs, scales

  def posterior(self):
    """The posterior `q` as a `NaturalGaussian` over `[w for w in parameter_names]`."""
    locs, scales = self.posterior_loc_scale()
    return gaussian.from_loc_scale(locs, scales)

  def set_posterior(self, g):
    """Assigns `loc` and `u = softplus^-1(sigma - min_scale)` from natural params.

    `g` must have the structure of `posterior()` and positive precision
    (check with `tfbfl.gaussian.check_valid` where that is not guaranteed). A
    scale at or below `min_scale` cannot be represented and is clipped to just
    above it. Returns the grouped assign op (for graph mode).
    """
    self._check_built("set_posterior")
    g = self._as_structure(g, "g")
    locs, scales = gaussian.to_loc_scale(g)
    ops = []
    for n, loc, scale in zip(self._param_names, locs, scales):
      var_loc = getattr(self, f"{n}_loc")
      var_u = getattr(self, f"{n}_untransformed_scale")
      excess = tf.cast(scale, var_u.dtype) - self.min_scale
      tiny = np.finfo(var_u.dtype.as_numpy_dtype).tiny
      excess = tf.maximum(excess, tiny)
      ops.append(var_loc.assign(tf.cast(loc, var_loc.dtype)))
      ops.append(var_u.assign(tfp.math.softplus_inverse(excess)))
    return tf.group(*ops)

  def prior(self):
    """The prior as a `NaturalGaussian` over `[w for w in parameter_names]`."""
    self._check_built("prior")
    return gaussian.NaturalGaussian(
        [tf.convert_to_tensor(getattr(self, f"{n}_prior_eta1")) for n in self._param_names],
        [tf.convert_to_tensor(getattr(self, f"{n}_prior_eta2")) for n in self._param_names],
    )

  def set_prior(self, g):
    """Assigns the prior's natural parameters. Returns the grouped assign op."""
    self._check_built("set_prior")
    g = self._as_structure(g, "g")
    ops = []
    for n, eta1, eta2 in zip(self._param_names, g.eta1, g.eta2):
      v1 = getattr(self, f"{n}_prior_eta1")
      v2 = getattr(self, f"{n}_prior_eta2")
      ops.append(v1.assign(tf.cast(eta1, v1.dtype)))
      ops.append(v2.assign(tf.cast(eta2, v2.dtype)))
    return tf.group(*ops)

  def kl_divergence(self):
    """`KL(q || p)` summed over all parameters (a scalar), in closed form, unweighted."""
    return gaussian.kl_divergence(self.posterior(), self.prior())

  def distributions(self):
    """`{name: (q, p)}`: posterior and prior of each parameter tensor as TFP
    distributions, `tfd.Independent(tfd.Normal(loc, scale))` over the whole tensor
    (the prior's `loc = eta1 / eta2`, `scale = eta2^(-1/2)`)."""
    self._check_built("distributions")
    locs, scales = self.posterior_loc_scale()
    prior = self.prior()
    pairs = {}
    for n, loc, scale, eta1, eta2 in zip(self._param_names, locs, scales, prior.eta1, prior.eta2):
      ndims = loc.shape.rank
      q = tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=ndims)
      p = tfd.Independent(tfd.Normal(eta1 / eta2, tf.math.rsqrt(eta2)),
                          reinterpreted_batch_ndims=ndims)
      pairs[n] = (q, p)
    return pairs

  def divergence_loss(self):
    """The scalar this layer adds to `layer.losses` (see the class docstring):
    `kl_weight * kl_divergence()`, `sum_w divergence_fn(q(w), p(w), None)`, or
    `kl_divergence()` when neither argument was given."""
    if self.divergence_fn is not None:
      terms = [
          tf.reduce_sum(self.divergence_fn(q, p, None)) for q, p in self.distributions().values()
      ]
      return tf.add_n(terms)
    kl = self.kl_divergence()
    if self.kl_weight is None:
      return kl
    return kl * tf.constant(self.kl_weight, kl.dtype)

  def _as_structure(self, g, name):
    eta1, eta2 = check_natural_gaussian(g, name)
    if len(eta1) != len(self._param_names) or len(eta2) != len(self._param_names):
      raise ValueError(f"`{name}` must hold {len(self._param_names)} tensors per natural parameter "
                       f"(one per {list(self._param_names)}), got {len(eta1)} and {len(eta2)}.")
    return gaussian.NaturalGaussian(eta1, eta2)

  # -- serialisation -----------------------------------------------------------------

  def get_config(self):
    config = super().get_config()
    config.update(
        activation=tf.keras.activations.serialize(self.activation),
        prior_scale=self.prior_scale,
        init_scale=self.init_scale,
        min_scale=self.min_scale,
        variance_epsilon=self.variance_epsilon,
        seed=self.seed,
        kl_weight=self.kl_weight,
        divergence_fn=serialize_divergence_fn(self.divergence_fn),
    )
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    if "divergence_fn" in config:
      config["divergence_fn"] = deserialize_divergence_fn(config["divergence_fn"])
    return cls(**config)
