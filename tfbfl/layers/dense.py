"""Bayesian dense layer with the local reparameterization trick."""

import tensorflow as tf

from tfbfl.layers.base import MeanFieldGaussianLayer, check_positive_int

__all__ = ["BayesianDense"]


@tf.keras.utils.register_keras_serializable(package="tfbfl")
class BayesianDense(MeanFieldGaussianLayer):
  """Dense layer with a mean-field Gaussian posterior and local reparameterization.

  The kernel `W` (`[n_in, units]`) and bias `b` (`[units]`) have posterior
  `q(W, b) = prod N(mu, sigma^2)` with trainable `kernel_loc`, `bias_loc` (`mu`) and
  `kernel_untransformed_scale`, `bias_untransformed_scale` (`u`),
  `sigma = softplus(u) + min_scale` (`min_scale = 1e-6` by default), and a Gaussian
  prior held in the non-trainable natural parameters `kernel_prior_eta1`,
  `kernel_prior_eta2`, `bias_prior_eta1`, `bias_prior_eta2`
  (`eta1 = mu_p / sigma_p^2`, `eta2 = 1 / sigma_p^2`), initialised to
  `N(0, prior_scale^2)`.

  `call(x, seed)` with a `[2]` integer `seed` samples the pre-activation with the
  local reparameterization trick [(Kingma et al., 2015)][1], as
  `tfp.layers.DenseLocalReparameterization` does: since `x W + b` is Gaussian
  given `x`,

  ```none
  m = x mu_W + mu_b
  v = x^2 sigma_W^2 + sigma_b^2
  y = activation(m + sqrt(v + variance_epsilon) * e),   e ~ N(0, I)
  ```

  with `e` drawn by `tf.random.stateless_normal(seed)` (no graph-level seeds: TFF
  forbids them, and equal seeds give equal outputs). `variance_epsilon`
  (default `1e-8`) keeps `sqrt` differentiable where `v` is exactly zero, e.g. for
  zero inputs after a ReLU when the bias scale underflows. `call(x, training=True)`
  without a seed (what Keras' `fit` does) samples the same way from a fresh seed
  at every call. `call(x)` (no seed; `training` false or unset, as in `predict` and
  `evaluate`) is the deterministic forward pass with the posterior mean,
  `activation(m)`, used for evaluation.

  `kl_divergence()` is the closed form `KL(q(W, b) || p(W, b))`. The layer
  registers `divergence_loss()` as a callable loss: `kl_weight * KL` with
  `kl_weight`, TFP-style `divergence_fn(q_W, p_W, None) + divergence_fn(q_b, p_b,
  None)` with `divergence_fn`, and the unweighted `KL` when neither is given (so
  `layer.losses == [layer.kl_divergence()]` by default, as before). In a Keras
  model trained on `N` examples with a per-example (batch-mean) loss, set
  `kl_weight=1/N`: the loss `fit` minimises is then a one-sample estimate of

  ```none
  -ELBO / N = -(1/N) sum_n E_q[log p(y_n | x_n, W, b)] + KL(q || p) / N
  ```

  (see `MeanFieldGaussianLayer`). tfbfl's federated algorithms call
  `kl_divergence()` themselves with their own weights and pass explicit seeds, so
  neither `kl_weight` nor `training` affects them.

  The one class plays both roles of VIRTUAL [(Corinzia et al., 2019)][2], eq. (3):

  * **shared (server) layer** of client `i`: its posterior is
    `q = s_i * cavity`, `cavity = s / s_i^old` (set with `set_posterior`), and its
    prior is set every round to `p(theta)^(1/K) * cavity` (with `set_prior`), so
    `kl_divergence()` is `KL(s_i * cavity || p^(1/K) * cavity)`, the first term of
    eq. (3). The new factor is read back as `posterior() / cavity`.
  * **private (client) layer**: the prior stays `N(0, prior_scale^2)` and
    `kl_divergence()` is `KL(c_i || p(phi_i))`, the second term.

  Args:
    units: positive int, output width.
    activation: Keras activation (name or callable); `None` is linear.
    prior_scale: standard deviation of the initial zero-mean prior.
    init_scale: initial posterior standard deviation of every weight (small, so
      that the network starts close to a deterministic Glorot-initialised one).
    min_scale: floor added to `softplus(u)`; `0 <= min_scale < init_scale`.
    variance_epsilon: added to the output variance inside `sqrt`.
    seed: Python int or `None`; seeds the (stateless) Glorot-normal initial
      `kernel_loc`. `bias_loc` starts at zero. (Sampling noise is seeded by the
      `seed` argument of `call`, or drawn fresh in training mode.)
    kl_weight: `None` or a float `>= 0`, the multiplier of the KL added to
      `layer.losses`; typically `1 / num_train_examples`. `None` (default) means
      weight 1, the full KL, unless `divergence_fn` is given.
    divergence_fn: `None` or a callable `(q, p, _) -> scalar` (TFP's
      `kernel_divergence_fn` convention), applied to kernel and bias and summed,
      replacing `kl_weight * KL`, e.g.
      `lambda q, p, _: tfd.kl_divergence(q, p) / n`. At most one of `kl_weight`
      and `divergence_fn` may be given. Use a module-level (ideally
      Keras-registered) function for models that are saved and reloaded.
    **kwargs: `tf.keras.layers.Layer` arguments (`name`, `dtype`, ...).

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl.layers import BayesianDense

  layer = BayesianDense(3, activation="relu", seed=1)
  layer.build((None, 4))
  x = tf.ones([2, 4])
  mean_out = layer(x)                           # posterior-mean forward
  sample = layer(x, seed=tf.constant([7, 0]))   # one local-reparameterized sample
  kl = layer.kl_divergence()                    # == tf.add_n(layer.losses)
  q = layer.posterior()                         # NaturalGaussian over [kernel, bias]
  layer.set_prior(q)                            # now KL(q || q) == 0
  ```

  In a Keras model (`x_train`: `[N, 64]`, `y_train`: `[N]` class ids):

  ```python
  n = len(x_train)
  model = tf.keras.Sequential([
      tf.keras.Input([64]),
      BayesianDense(32, activation="relu", kl_weight=1 / n),
      BayesianDense(10, kl_weight=1 / n),
  ])
  model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  model.fit(x_train, y_train, epochs=20, batch_size=32)  # samples; adds KL / N
  probs = tf.nn.softmax(model.predict(x_test))           # posterior-mean network
  mc = tf.reduce_mean([tf.nn.softmax(model(x_test, training=True))
                       for _ in range(20)], 0)           # Monte Carlo predictive
  model.save("bnn.keras")                                # no custom_objects needed
  ```

  #### References

  [1]: Diederik P. Kingma, Tim Salimans, Max Welling. Variational Dropout and the
       Local Reparameterization Trick. In _Neural Information Processing
       Systems_, 2015. https://arxiv.org/abs/1506.02557
  [2]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  """

  def __init__(
      self,
      units,
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
    super().__init__(
        activation=activation,
        prior_scale=prior_scale,
        init_scale=init_scale,
        min_scale=min_scale,
        variance_epsilon=variance_epsilon,
        seed=seed,
        kl_weight=kl_weight,
        divergence_fn=divergence_fn,
        **kwargs,
    )
    self.units = check_positive_int("units", units)
    self.input_spec = tf.keras.layers.InputSpec(min_ndim=2)

  def _parameter_shapes(self, input_shape):
    n_in = input_shape[-1]
    if n_in is None:
      raise ValueError("`input_shape` must have a known last dimension, got "
                       f"{input_shape}.")
    n_in = int(n_in)
    self.input_spec = tf.keras.layers.InputSpec(min_ndim=2, axes={-1: n_in})
    return [
        ("kernel", [n_in, self.units], n_in, self.units, True),
        ("bias", [self.units], n_in, self.units, False),
    ]

  @staticmethod
  def _affine(inputs, params):
    return tf.nn.bias_add(tf.matmul(inputs, params["kernel"]), params["bias"])

  def _apply_variational(self, inputs, locs, variances, seed):
    return self._local_reparameterization(self._affine, inputs, locs, variances, seed)

  def compute_output_shape(self, input_shape):
    return tf.TensorShape(input_shape)[:-1].concatenate([self.units])

  def get_config(self):
    config = super().get_config()
    config.update(units=self.units)
    return config
