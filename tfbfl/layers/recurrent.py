"""Bayesian recurrent layers: an LSTM and a Gaussian embedding table."""

import numpy as np
import tensorflow as tf

from tfbfl.layers.base import (
    MeanFieldGaussianLayer,
    check_finite_float,
    check_positive_int,
)

__all__ = ["BayesianLSTM", "GaussianEmbedding"]


@tf.keras.utils.register_keras_serializable(package="tfbfl")
class BayesianLSTM(MeanFieldGaussianLayer):
  """LSTM with a mean-field Gaussian posterior, one weight draw per sequence batch.

  Parameters, in the order of `posterior()`: `kernel` (`[n_in, 4 units]`),
  `recurrent_kernel` (`[units, 4 units]`) and `bias` (`[4 units]`), each with
  posterior `N(mu, sigma^2)`, `sigma = softplus(u) + min_scale`, and a Gaussian prior
  in non-trainable natural parameters, initialised to `N(0, prior_scale^2)` (all of
  it is `MeanFieldGaussianLayer`, exactly as for `BayesianDense`). The gate blocks
  are laid out as in `tf.keras.layers.LSTM` (input `i`, forget `f`, cell `c~`,
  output `o`), and the recurrence is Keras' with `sigmoid` gates and `tanh`
  activations, for `t = 1..T` from `h_0 = c_0 = 0`:

  ```none
  [z_i, z_f, z_c, z_o] = x_t K + h_(t-1) R + b
  i = sigmoid(z_i),  f = sigmoid(z_f + forget_bias),  o = sigmoid(z_o)
  c_t = f * c_(t-1) + i * tanh(z_c)
  h_t = o * tanh(c_t)
  ```

  `forget_bias` (default `1.0`) is a constant offset, not a parameter: the learned
  bias, its prior and its KL stay centred at zero while the forget gates start open
  (the role Keras' `unit_forget_bias=True` initialisation plays). A Keras LSTM with
  bias `b + [0, forget_bias, 0, 0]` (blockwise) computes the same function.

  **Sampling.** `call(x, seed)` with a `[2]` integer `seed` follows Bayes by
  Backprop through time [(Fortunato et al., 2017)][1]: *one* draw of all weights,

  ```none
  (K, R, b) = mu + sigma * e,    e ~ N(0, I)  (stateless, from `seed`)
  ```

  is made per call and shared by every time step and every sequence of the batch
  (the recurrence must see the same weights at every step for the sample to be a
  network; sharing it across the batch is the paper's "one sample per minibatch",
  which keeps the cost at one draw). The noise comes from
  `tf.random.stateless_normal` on seeds split from `seed`
  (`tf.random.experimental.stateless_split(seed, 3)`, one per parameter), so equal
  seeds give equal outputs; `sample_parameters(seed)` returns the very draw a
  `call` with that seed uses. `call(x, training=True)` without a seed (Keras'
  `fit`) makes one such draw from a fresh seed at every call. `call(x)` without a
  seed (`training` false or unset) runs the posterior mean. Local
  reparameterization is not possible here: the hidden state is not linear in the
  weights. The recurrence is a `tf.scan` over time (a `while` loop in graphs, TFF
  included) after one matmul of all inputs with `K`.

  Args:
    units: positive int, width of the hidden state.
    return_sequences: if True, `call` returns `[batch, T, units]` (every `h_t`);
      otherwise `[batch, units]` (`h_T`).
    forget_bias: finite float added to the forget gate pre-activation.
    prior_scale, init_scale, min_scale: as in `BayesianDense`.
    seed: Python int or `None`; seeds the stateless Glorot-normal initial
      `kernel_loc` (`fan_in = n_in`, `fan_out = 4 units`) and `recurrent_kernel_loc`
      (`fan_in = units`, `fan_out = 4 units`); `bias_loc` starts at zero.
    kl_weight, divergence_fn: the term added to `layer.losses`, as in
      `BayesianDense`: `kl_weight * KL` (`kl_weight=None`, the default, is weight
      1), or TFP-style `divergence_fn(q, p, None)` summed over `kernel`,
      `recurrent_kernel` and `bias`. Use `kl_weight = 1 / N` (`N` training
      sequences) with a batch-mean loss for the per-example ELBO.
    **kwargs: `tf.keras.layers.Layer` arguments (`name`, `dtype`, ...).

  Inputs are `[batch, T, n_in]` floats. There is no masking: pad at the end and mask
  the loss, or use fixed-length sequences (LEAF Shakespeare: 80 characters).

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl.layers import BayesianLSTM

  lstm = BayesianLSTM(5, return_sequences=True, seed=0)
  lstm.build((None, None, 3))
  x = tf.random.normal([2, 7, 3])
  h_mean = lstm(x)                              # [2, 7, 5], posterior-mean weights
  h = lstm(x, seed=tf.constant([4, 2]))         # one weight draw for all 7 steps
  draw = lstm.sample_parameters(tf.constant([4, 2]))  # {'kernel': ..., ...}
  kl = lstm.kl_divergence()                     # == tf.add_n(lstm.losses)
  ```

  #### References

  [1]: Meire Fortunato, Charles Blundell, Oriol Vinyals. Bayesian Recurrent Neural
       Networks. https://arxiv.org/abs/1704.02798
  [2]: Sepp Hochreiter, Juergen Schmidhuber. Long Short-Term Memory. _Neural
       Computation_, 9(8), 1997.
  [3]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  """

  def __init__(
      self,
      units,
      return_sequences=False,
      forget_bias=1.0,
      prior_scale=1.0,
      init_scale=1e-3,
      min_scale=1e-6,
      seed=None,
      kl_weight=None,
      divergence_fn=None,
      **kwargs,
  ):
    super().__init__(
        activation=None,
        prior_scale=prior_scale,
        init_scale=init_scale,
        min_scale=min_scale,
        seed=seed,
        kl_weight=kl_weight,
        divergence_fn=divergence_fn,
        **kwargs,
    )
    self.units = check_positive_int("units", units)
    if not isinstance(return_sequences, (bool, np.bool_)):
      raise ValueError(f"`return_sequences` must be a bool, got {return_sequences!r}.")
    self.return_sequences = bool(return_sequences)
    self.forget_bias = check_finite_float("forget_bias", forget_bias)
    self.input_spec = tf.keras.layers.InputSpec(ndim=3)

  def _parameter_shapes(self, input_shape):
    n_in = self._known_last_dim(input_shape, ("batch", "time", "features"))
    u = self.units
    return [
        ("kernel", [n_in, 4 * u], n_in, 4 * u, True),
        ("recurrent_kernel", [u, 4 * u], u, 4 * u, True),
        ("bias", [4 * u], n_in, 4 * u, False),
    ]

  def _draw(self, locs, variances, seed):
    if variances is None:
      return dict(locs)
    seeds = tf.random.experimental.stateless_split(tf.convert_to_tensor(seed),
                                                   num=len(self._param_names))
    draws = {}
    for i, name in enumerate(self._param_names):
      loc = tf.convert_to_tensor(locs[name])
      noise = tf.random.stateless_normal(tf.shape(loc), seed=seeds[i], dtype=loc.dtype)
      # sqrt has an infinite derivative at 0, reached when `min_scale=0` and
      # softplus(u) underflows: clamp at `tiny` (no change for any larger
      # variance) so the gradient stays finite (it is 0 there).
      variance = tf.convert_to_tensor(variances[name])
      tiny = np.finfo(variance.dtype.as_numpy_dtype).tiny
      draws[name] = loc + tf.sqrt(tf.maximum(variance, tiny)) * noise
    return draws

  def sample_parameters(self, seed=None):
    """`{name: tensor}`: the weights `call(x, seed)` uses (the means if no seed)."""
    self._check_built("sample_parameters")
    locs, scales = self.posterior_loc_scale()
    locs = dict(zip(self._param_names, locs))
    variances = None
    if seed is not None:
      variances = {n: tf.square(s) for n, s in zip(self._param_names, scales)}
    return self._draw(locs, variances, seed)

  def _apply_variational(self, inputs, locs, variances, seed):
    w = self._draw(locs, variances, seed)
    kernel = tf.convert_to_tensor(w["kernel"])
    recurrent = tf.convert_to_tensor(w["recurrent_kernel"])
    offset = tf.constant(
        np.repeat(np.array([0.0, self.forget_bias, 0.0, 0.0]), self.units),
        dtype=kernel.dtype,
    )
    bias = w["bias"] + offset
    # All input projections at once, then a time-major scan over the recurrence.
    projected = tf.nn.bias_add(tf.matmul(inputs, kernel), bias)  # [B, T, 4u]
    projected = tf.transpose(projected, [1, 0, 2])
    zeros = tf.zeros([tf.shape(inputs)[0], self.units], dtype=kernel.dtype)

    def step(state, z_x):
      h, c = state
      z = z_x + tf.matmul(h, recurrent)
      z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
      c = tf.sigmoid(z_f) * c + tf.sigmoid(z_i) * tf.tanh(z_c)
      h = tf.sigmoid(z_o) * tf.tanh(c)
      return h, c

    hs, _ = tf.scan(step, projected, initializer=(zeros, zeros))
    if self.return_sequences:
      return tf.transpose(hs, [1, 0, 2])
    return hs[-1]

  def compute_output_shape(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    if self.return_sequences:
      return input_shape[:-1].concatenate([self.units])
    return tf.TensorShape([input_shape[0], self.units])

  def get_config(self):
    config = super().get_config()
    for key in ("activation", "variance_epsilon"):
      config.pop(key, None)
    config.update(
        units=self.units,
        return_sequences=self.return_sequences,
        forget_bias=self.forget_bias,
    )
    return config


@tf.keras.utils.register_keras_serializable(package="tfbfl")
class GaussianEmbedding(MeanFieldGaussianLayer):
  """Embedding table with a mean-field Gaussian posterior over its entries.

  Token `k` has the embedding `E_k`, a row of the table `E` (`[input_dim,
  output_dim]`) with posterior `q(E) = prod N(mu, sigma^2)`,
  `sigma = softplus(u) + min_scale`, and a Gaussian prior in non-trainable natural
  parameters (`embeddings_prior_eta1`, `embeddings_prior_eta2`), initialised to
  `N(0, prior_scale^2)`: every token is a diagonal Gaussian in the embedding space,
  as in Gaussian word embeddings [(Vilnis and McCallum, 2015)][1], here learned
  variationally (closed-form KL, `MeanFieldGaussianLayer`).

  `call(ids, seed)` with a `[2]` integer `seed` uses local reparameterization on
  the lookups: each occurrence of a token gets its own draw

  ```none
  y[..., :] = mu[ids[...]] + sqrt(sigma^2[ids[...]] + variance_epsilon) * e[...],
  e ~ N(0, I)  (tf.random.stateless_normal(seed))
  ```

  A lookup *is* its row of `E`, so each output has exactly the marginal it would
  have under one draw of the whole table; what differs is that two occurrences of a
  token are independent rather than equal. That is the local reparameterization of
  a dense layer on one-hot inputs [(Kingma et al., 2015)][2]: lower-variance
  gradients, and no `[input_dim, output_dim]` draw per step. `call(ids,
  training=True)` without a seed (Keras' `fit`) samples from a fresh seed at every
  call; `call(ids)` (no seed, `training` false or unset) returns `mu[ids]`.

  Inputs are token ids of any shape; floating ids (e.g. from a float32 dataset)
  are cast to int32. Out-of-range ids are an error on CPU (`tf.gather`) and give
  zeros on GPU: map unknown characters to an OOV id beforehand.

  Args:
    input_dim: positive int, vocabulary size (ids in `[0, input_dim)`).
    output_dim: positive int, embedding width.
    prior_scale, init_scale, min_scale, variance_epsilon: as in `BayesianDense`.
    seed: Python int or `None`; seeds the stateless Glorot-normal initial means
      (`fan_in = input_dim`, `fan_out = output_dim`, i.e. a dense layer on one-hot
      inputs).
    kl_weight, divergence_fn: the term added to `layer.losses`, as in
      `BayesianDense` (`kl_weight=None`, the default, is the unweighted KL).
    **kwargs: `tf.keras.layers.Layer` arguments.

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl.layers import GaussianEmbedding

  emb = GaussianEmbedding(input_dim=88, output_dim=8, seed=0)
  emb.build((None, None))
  ids = tf.constant([[1, 5, 5], [0, 2, 87]])
  mean = emb(ids)                               # [2, 3, 8] = table means
  draw = emb(ids, seed=tf.constant([0, 1]))     # one draw per lookup
  kl = emb.kl_divergence()
  ```

  #### References

  [1]: Luke Vilnis, Andrew McCallum. Word Representations via Gaussian Embedding.
       In _International Conference on Learning Representations_, 2015.
       https://arxiv.org/abs/1412.6623
  [2]: Diederik P. Kingma, Tim Salimans, Max Welling. Variational Dropout and the
       Local Reparameterization Trick. In _Neural Information Processing
       Systems_, 2015. https://arxiv.org/abs/1506.02557
  """

  def __init__(
      self,
      input_dim,
      output_dim,
      prior_scale=1.0,
      init_scale=1e-3,
      min_scale=1e-6,
      variance_epsilon=1e-8,
      seed=None,
      kl_weight=None,
      divergence_fn=None,
      **kwargs,
  ):
    super().__init__(
        activation=None,
        prior_scale=prior_scale,
        init_scale=init_scale,
        min_scale=min_scale,
        variance_epsilon=variance_epsilon,
        seed=seed,
        kl_weight=kl_weight,
        divergence_fn=divergence_fn,
        **kwargs,
    )
    self.input_dim = check_positive_int("input_dim", input_dim)
    self.output_dim = check_positive_int("output_dim", output_dim)

  def _parameter_shapes(self, input_shape):
    del input_shape  # any shape of ids
    return [(
        "embeddings",
        [self.input_dim, self.output_dim],
        self.input_dim,
        self.output_dim,
        True,
    )]

  @staticmethod
  def _lookup(ids, params):
    return tf.gather(params["embeddings"], ids)

  def _apply_variational(self, inputs, locs, variances, seed):
    ids = inputs
    if not ids.dtype.is_integer:
      ids = tf.cast(ids, tf.int32)
    # A lookup is a dense layer on one-hot ids, which are their own squares.
    return self._local_reparameterization(self._lookup,
                                          ids,
                                          locs,
                                          variances,
                                          seed,
                                          square_inputs=False)

  def compute_output_shape(self, input_shape):
    return tf.TensorShape(input_shape).concatenate([self.output_dim])

  def get_config(self):
    config = super().get_config()
    config.pop("activation", None)
    config.update(input_dim=self.input_dim, output_dim=self.output_dim)
    return config
