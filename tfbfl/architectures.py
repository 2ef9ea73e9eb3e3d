"""VIRTUAL's convolutional and recurrent networks, and their deterministic twins.

* `VirtualConvNetworks`: the FEMNIST conv net of VIRTUAL (two 5x5 Bayesian
  convolutions with 32 and 64 filters, 2x2 max-pooling after each, then the 2x100
  MLP and the logits) as a server network plus one client's laterally connected
  private network.
* `VirtualLSTMNetworks`: the Shakespeare next-character model (8-d Gaussian
  embedding, two Bayesian LSTMs of 100 units, logits over the vocabulary), same
  structure.
* `initial_shared_posterior_conv`, `initial_private_weights_conv`,
  `initial_shared_posterior_lstm`, `initial_private_weights_lstm`: the initial
  values of a fresh network, from stateless ops only, deterministic in `seed`.
* `build_deterministic_conv`, `build_deterministic_lstm`: point-estimate Keras
  models (logits) with the server network's shapes, for FedAvg/FedProx/FOLA.

Both network classes expose exactly the interface of `tfbfl.models.VirtualNetworks`
(`forward`, `server_logits`, `client_logits`, `shared_posterior`,
`set_shared_posterior`, `shared_prior`, `set_shared_prior`, `kl_shared`,
`kl_private`, `shared_trainable_variables`, `private_trainable_variables`,
`get_private_weights`, `set_private_weights`), so the VIRTUAL algorithm can use any
of the three through a builder.
"""

import numpy as np
import tensorflow as tf

from tfbfl.layers import BayesianConv2D, BayesianDense, BayesianLSTM, GaussianEmbedding
from tfbfl.layers.base import check_positive_int, check_seed, derive_seed, is_int
from tfbfl.layers.conv import conv_output_size
from tfbfl.models import (
  _SERVER,
  _dense_plan,
  _deterministic_dense_layers,
  _initial_private_weights,
  _initial_shared_posterior,
  _lateral,
  _LateralNetworks,
  _plan_depth,
)

__all__ = [
  "VirtualConvNetworks",
  "VirtualLSTMNetworks",
  "build_deterministic_conv",
  "build_deterministic_lstm",
  "initial_private_weights_conv",
  "initial_private_weights_lstm",
  "initial_shared_posterior_conv",
  "initial_shared_posterior_lstm",
]

# Vocabulary of the Shakespeare model: 86 characters, id 0 for padding and the last
# id for out-of-vocabulary characters (`tfbfl.data.shakespeare.VOCAB_SIZE`).
DEFAULT_VOCAB_SIZE = 86 + 2


# -- validation --------------------------------------------------------------------


def _positive_ints(name, values, allow_empty=True):
  if is_int(values) or not hasattr(values, "__iter__") or isinstance(values, str):
    raise ValueError(f"`{name}` must be a sequence of positive ints, got {values!r}.")
  values = tuple(values)
  if not all(is_int(v) and v > 0 for v in values) or (
    not allow_empty and not values
  ):
    raise ValueError(f"`{name}` must be a sequence of positive ints, got {values!r}.")
  return tuple(int(v) for v in values)


def _image_shape(input_shape):
  """`(H, W, C)` from `(H, W)` (one channel) or `(H, W, C)`."""
  try:
    dims = tuple(input_shape)
  except TypeError:
    dims = None
  if dims is None or len(dims) not in (2, 3) or not all(
    is_int(d) and d > 0 for d in dims
  ):
    raise ValueError(
      "`input_shape` must be the image shape (height, width) or (height, width, "
      f"channels) of positive ints, got {input_shape!r}."
    )
  dims = tuple(int(d) for d in dims)
  return dims if len(dims) == 3 else dims + (1,)


# -- convolutional network -------------------------------------------------------


def _conv_geometry(input_shape, filters, kernel_size, pool_size, padding):
  """Per conv stage `(in_shape, conv_out_shape, pooled_shape)`, checked."""
  image = _image_shape(input_shape)
  filters = _positive_ints("filters", filters)
  kernel_size = check_positive_int("kernel_size", kernel_size)
  pool_size = check_positive_int("pool_size", pool_size)
  if not isinstance(padding, str) or padding.lower() not in ("same", "valid"):
    raise ValueError(f"`padding` must be 'same' or 'valid', got {padding!r}.")
  stages = []
  h, w, c = image
  for f in filters:
    ch = conv_output_size(h, kernel_size, 1, padding)
    cw = conv_output_size(w, kernel_size, 1, padding)
    ph, pw = ch // pool_size, cw // pool_size
    if min(ch, cw, ph, pw) < 1:
      raise ValueError(
        f"`input_shape` {tuple(input_shape)} is too small for {len(filters)} "
        f"{kernel_size}x{kernel_size} '{padding}' convolutions with "
        f"{pool_size}x{pool_size} pooling."
      )
    stages.append(((h, w, c), (ch, cw, f), (ph, pw, f)))
    h, w, c = ph, pw, f
  return image, filters, kernel_size, pool_size, padding.lower(), stages, h * w * c


def _conv_plan(
  input_shape,
  num_classes,
  filters,
  kernel_size,
  pool_size,
  padding,
  hidden_units,
  activation,
  prior_scale,
  init_scale,
  adapter_units,
  gate_init,
  seed,
):
  """Unbuilt layers and their input shapes, per depth (conv stages, then dense)."""
  _, filters, kernel_size, _, padding, stages, flat = _conv_geometry(
    input_shape, filters, kernel_size, pool_size, padding
  )
  num_classes = check_positive_int("num_classes", num_classes)
  hidden = _positive_ints("hidden_units", hidden_units)
  if adapter_units is not None:
    adapter_units = check_positive_int("adapter_units", adapter_units)
  seed = check_seed(seed)
  common = dict(prior_scale=prior_scale, init_scale=init_scale)
  plan = []
  for l, ((h, w, c), (ch, cw, f), _) in enumerate(stages):
    lateral = _lateral(f, adapter_units, activation, gate_init, seed, l, common)
    plan.append(
      _plan_depth(
        l,
        seed,
        BayesianConv2D,
        (None, h, w, c),
        (lateral, (None, ch, cw, f)),
        server_kwargs=dict(activation=activation),
        filters=f,
        kernel_size=kernel_size,
        padding=padding,
        **common,
      )
    )
  plan += _dense_plan(
    [flat] + list(hidden),
    list(hidden) + [num_classes],
    len(stages),
    activation,
    adapter_units,
    gate_init,
    seed,
    common,
  )
  return plan


class VirtualConvNetworks(_LateralNetworks):
  """VIRTUAL's convolutional server network and one client's laterally fed network.

  With `C = len(filters)` convolutional stages, `D = len(hidden_units) + 1` dense
  layers, `x` the image (`[batch, H, W, channels]`; any input with `H W channels`
  entries per example is reshaped to it, so flattened images work) and `pool` a
  `pool_size x pool_size` max-pooling with stride `pool_size`:

  ```none
  server, conv stage l:  a_s^l = act(conv_s^l(h_s^(l-1))),         h_s^l = pool(a_s^l)
  client, conv stage l:  a_c^l = act(conv_c^l(h_c^(l-1)) + lat_l(a_s^l)),
                         h_c^l = pool(a_c^l)
  lat_l(a) = g_l * (U_l act(V_l a + c_l) + d_l)     (per pixel: 1x1 convolutions)
  then both flatten and continue as tfbfl.models.VirtualNetworks:
  server, dense l:       h_s^l = act(W_s^l h_s^(l-1) + b_s^l)          (logits: no act)
  client, dense l:       h_c^l = act(W_c^l h_c^(l-1) + b_c^l + lat_l(h_s^l))
  ```

  `conv` is a `BayesianConv2D` (`kernel_size x kernel_size`, stride 1, `padding`)
  and every dense layer a `BayesianDense`, all sampled by local reparameterization.

  **Lateral form on convolutional stages.** The server feature map `a_s^l`, taken
  after its activation and *before* pooling so that it has the client's
  pre-activation resolution, enters the client additively through a
  `LateralConnection` applied to the channel axis at every position: `V_l`
  (`filters -> adapter`) and `U_l` (`adapter -> filters`) are Bayesian `1 x 1`
  convolutions (a `BayesianDense` on the last axis computes exactly that, with
  independent local-reparameterization noise per position) and the gate `g_l` has
  one entry per channel. This is the Progressive-Networks adapter
  [(Rusu et al., 2016)][2] of the MLP version, with dense maps replaced by `1 x 1`
  convolutions as Rusu et al. do for their convolutional columns. The sum is formed
  at full resolution, where the client computes its pre-activation, and pooled
  afterwards. The dense part and its laterals are those of
  `tfbfl.models.VirtualNetworks`.

  The default geometry is the FEMNIST network of VIRTUAL [(Corinzia et al.,
  2019)][1], Section IV-B: two `5 x 5` convolutions with 32 and 64 filters, 'same'
  padding (28x28 -> 14x14 -> 7x7; the 8x8 bundled digits give 4x4 -> 2x2), 2x2
  max-pooling after each, then the MLP with `hidden_units = (100, 100)` on the
  flattened maps.

  Parameters, seeds and the natural-parameter interface are those of
  `tfbfl.models.VirtualNetworks`: `shared_posterior()` is a `NaturalGaussian` over
  `[conv_kernel_1, conv_bias_1, ..., dense_kernel_L, dense_bias_L]` of the server
  layers; `private_trainable_variables` are the client layers' posterior variables,
  then per depth the lateral's `V`, `U`, gate. `forward(x, seed)` splits `seed` into
  one seed per layer (`stateless_split(seed, 3 L)`: servers, clients, laterals), so
  `server_logits(x, seed) == forward(x, seed)[0]`. All variables are created in
  `__init__`, deterministically in `seed`, with the values of
  `initial_shared_posterior_conv` and `initial_private_weights_conv`.

  Args:
    input_shape: image shape `(H, W)` (one channel) or `(H, W, channels)`.
    num_classes: positive int, number of logits.
    filters: sequence of positive ints, filters per convolutional stage.
    kernel_size: positive int, square kernel size.
    pool_size: positive int, max-pooling window and stride.
    padding: `'same'` or `'valid'` convolutions.
    hidden_units: sequence of positive ints, widths of the dense hidden layers.
    activation: Keras activation of the hidden layers and of the adapters.
    prior_scale: standard deviation of the zero-mean priors.
    init_scale: initial posterior standard deviation of every Bayesian weight.
    adapter_units: width of every adapter's hidden layer; `None` uses the width
      (channels or units) of the client layer it feeds.
    gate_init: initial value of every lateral gate.
    seed: Python int (or `None` for unseeded initialisation).
    name: module name.

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl import architectures

  net = architectures.VirtualConvNetworks(
      input_shape=(8, 8), num_classes=10, filters=(4, 8), hidden_units=(16,))
  x = tf.random.uniform([5, 64])                # flattened 8x8 digits work too
  server_logits, client_logits = net.forward(x, seed=tf.constant([0, 1]))
  kl = net.kl_shared() + net.kl_private()
  net.set_shared_prior(net.shared_posterior())  # kl_shared() is now 0
  ```

  #### References

  [1]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  [2]: Andrei A. Rusu et al. Progressive Neural Networks.
       https://arxiv.org/abs/1606.04671
  [3]: Diederik P. Kingma, Tim Salimans, Max Welling. Variational Dropout and the
       Local Reparameterization Trick. https://arxiv.org/abs/1506.02557
  """

  def __init__(
    self,
    input_shape=(28, 28, 1),
    num_classes=10,
    filters=(32, 64),
    kernel_size=5,
    pool_size=2,
    padding="same",
    hidden_units=(100, 100),
    activation="relu",
    prior_scale=1.0,
    init_scale=1e-3,
    adapter_units=None,
    gate_init=1.0,
    seed=0,
    name=None,
  ):
    super().__init__(name=name)
    image, filters, _, pool_size, _, stages, flat = _conv_geometry(
      input_shape, filters, kernel_size, pool_size, padding
    )
    plan = _conv_plan(
      input_shape, num_classes, filters, kernel_size, pool_size, padding,
      hidden_units, activation, prior_scale, init_scale, adapter_units, gate_init,
      seed,
    )
    self.input_shape = image
    self.num_classes = int(num_classes)
    self.filters = filters
    self.hidden_units = tuple(hidden_units)
    self.activation = tf.keras.activations.get(activation)
    self._pool_size = pool_size
    self._num_conv = len(stages)
    self._flat_dim = flat
    self._build_plan(plan)

  def _images(self, x):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
      x = tf.cast(x, tf.float32)
    return tf.reshape(x, [-1, *self.input_shape])

  def _pool(self, h):
    p = self._pool_size
    return tf.nn.max_pool2d(h, ksize=p, strides=p, padding="VALID")

  def _flatten_maps(self, h):
    return tf.reshape(h, [-1, self._flat_dim])

  def forward(self, x, seed=None):
    """`(server_logits, client_logits)` from one pass; see the class docstring."""
    seeds = self._layer_seeds(seed)
    depth = self._depth
    h_s = h_c = self._images(x)
    if self._num_conv == 0:
      h_s = h_c = self._flatten_maps(h_s)
    for l in range(depth):
      a_s = self.server_layers[l](h_s, seed=seeds[l])
      pre = self.client_layers[l](h_c, seed=seeds[depth + l]) + self.laterals[l](
        a_s, seed=seeds[2 * depth + l]
      )
      if l < self._num_conv:
        h_s, h_c = self._pool(a_s), self._pool(self.activation(pre))
        if l == self._num_conv - 1:
          h_s, h_c = self._flatten_maps(h_s), self._flatten_maps(h_c)
      else:
        h_s, h_c = a_s, (pre if l == depth - 1 else self.activation(pre))
    return h_s, h_c

  def server_logits(self, x, seed=None):
    """The server network alone (metric S); equals `forward(x, seed)[0]`."""
    seeds = self._layer_seeds(seed)
    h_s = self._images(x)
    if self._num_conv == 0:
      h_s = self._flatten_maps(h_s)
    for l, layer in enumerate(self.server_layers):
      h_s = layer(h_s, seed=seeds[l])
      if l < self._num_conv:
        h_s = self._pool(h_s)
        if l == self._num_conv - 1:
          h_s = self._flatten_maps(h_s)
    return h_s


def initial_shared_posterior_conv(
  input_shape=(28, 28, 1),
  num_classes=10,
  filters=(32, 64),
  kernel_size=5,
  pool_size=2,
  padding="same",
  hidden_units=(100, 100),
  init_scale=1e-3,
  seed=0,
):
  """`VirtualConvNetworks(..., seed=seed).shared_posterior()` without a model.

  Stateless ops only: deterministic in `seed`, usable eagerly or in a graph/TFF
  computation. Returns a `NaturalGaussian` of float32 tensors.
  """
  plan = _conv_plan(
    input_shape, num_classes, filters, kernel_size, pool_size, padding,
    hidden_units, "relu", 1.0, init_scale, None, 1.0, seed,
  )
  return _initial_shared_posterior(plan)


def initial_private_weights_conv(
  input_shape=(28, 28, 1),
  num_classes=10,
  filters=(32, 64),
  kernel_size=5,
  pool_size=2,
  padding="same",
  hidden_units=(100, 100),
  init_scale=1e-3,
  adapter_units=None,
  gate_init=1.0,
  seed=0,
):
  """`VirtualConvNetworks(..., seed=seed).get_private_weights()` without a model.

  Stateless ops only, deterministic in `seed`; numpy arrays when executing
  eagerly, tensors inside a graph.
  """
  plan = _conv_plan(
    input_shape, num_classes, filters, kernel_size, pool_size, padding,
    hidden_units, "relu", 1.0, init_scale, adapter_units, gate_init, seed,
  )
  return _initial_private_weights(plan)


def build_deterministic_conv(
  input_shape=(28, 28, 1),
  num_classes=10,
  hidden_units=(100, 100),
  seed=0,
  filters=(32, 64),
  kernel_size=5,
  pool_size=2,
  padding="same",
  activation="relu",
  data_shape=None,
):
  """The point-estimate conv net with the server network's shapes (logits output).

  `Input(data_shape or input_shape)`, a `Reshape` to the image, then per stage
  `Conv2D(activation) -> MaxPool2D`, `Flatten`, the dense hidden layers and a linear
  logits layer. `data_shape` is the shape of one example as the dataset stores it
  (e.g. `(64,)` for the flattened 8x8 digits); it must have as many entries as the
  image. Glorot-normal kernels seeded from `seed` (Keras stateless initializers,
  deterministic in `seed`), zero biases; `model.weights` are in the order and shapes
  of `VirtualConvNetworks.shared_posterior()`. Build it where it is used (inside the
  TFF computation when it is used there: see the `_assert_built_as_v1` pitfall in
  the SPEC).
  """
  image, filters, kernel_size, pool_size, padding, stages, _ = _conv_geometry(
    input_shape, filters, kernel_size, pool_size, padding
  )
  num_classes = check_positive_int("num_classes", num_classes)
  hidden = _positive_ints("hidden_units", hidden_units)
  seed = check_seed(seed)
  data_shape = image if data_shape is None else tuple(data_shape)
  if int(np.prod(data_shape)) != int(np.prod(image)):
    raise ValueError(
      f"`data_shape` {data_shape} must have as many entries as the image {image}."
    )
  glorot = lambda l: tf.keras.initializers.GlorotNormal(seed=derive_seed(seed, _SERVER, l))
  layers = [tf.keras.Input(shape=data_shape), tf.keras.layers.Reshape(image)]
  for l, (_, _, (_, _, f)) in enumerate(stages):
    layers.append(
      tf.keras.layers.Conv2D(
        f,
        kernel_size,
        padding=padding,
        activation=activation,
        kernel_initializer=glorot(l),
        name=f"conv_{l}",
      )
    )
    layers.append(tf.keras.layers.MaxPool2D(pool_size, name=f"pool_{l}"))
  layers.append(tf.keras.layers.Flatten())
  widths = list(hidden) + [num_classes]
  layers += _deterministic_dense_layers(widths, len(stages), activation, seed)
  return tf.keras.Sequential(layers, name="deterministic_conv")


# -- recurrent network -----------------------------------------------------------


def _lstm_geometry(vocab_size, embedding_dim, lstm_units, return_sequences):
  """Checked `(vocab_size, embedding_dim, lstm_units)`; `return_sequences` a bool."""
  vocab_size = check_positive_int("vocab_size", vocab_size)
  embedding_dim = check_positive_int("embedding_dim", embedding_dim)
  lstm_units = _positive_ints("lstm_units", lstm_units, allow_empty=False)
  if not isinstance(return_sequences, (bool, np.bool_)):
    raise ValueError(f"`return_sequences` must be a bool, got {return_sequences!r}.")
  return vocab_size, embedding_dim, lstm_units


def _lstm_plan(
  vocab_size,
  embedding_dim,
  lstm_units,
  return_sequences,
  forget_bias,
  adapter_activation,
  prior_scale,
  init_scale,
  adapter_units,
  gate_init,
  seed,
):
  vocab_size, embedding_dim, lstm_units = _lstm_geometry(
    vocab_size, embedding_dim, lstm_units, return_sequences
  )
  if adapter_units is not None:
    adapter_units = check_positive_int("adapter_units", adapter_units)
  seed = check_seed(seed)
  common = dict(prior_scale=prior_scale, init_scale=init_scale)
  lateral = lambda units, l: _lateral(
    units, adapter_units, adapter_activation, gate_init, seed, l, common
  )
  plan = [
    _plan_depth(
      0,
      seed,
      GaussianEmbedding,
      (None, None),
      (lateral(embedding_dim, 0), (None, None, embedding_dim)),
      input_dim=vocab_size,
      output_dim=embedding_dim,
      **common,
    )
  ]
  n_in = embedding_dim
  for k, units in enumerate(lstm_units):
    l = k + 1
    sequences = return_sequences or k < len(lstm_units) - 1
    out_shape = (None, None, units) if sequences else (None, units)
    plan.append(
      _plan_depth(
        l,
        seed,
        BayesianLSTM,
        (None, None, n_in),
        (lateral(units, l), out_shape),
        units=units,
        return_sequences=sequences,
        forget_bias=forget_bias,
        **common,
      )
    )
    n_in = units
  l = len(lstm_units) + 1
  out_shape = (None, None, vocab_size) if return_sequences else (None, vocab_size)
  plan.append(
    _plan_depth(
      l,
      seed,
      BayesianDense,
      (None, n_in),
      (lateral(vocab_size, l), out_shape),
      units=vocab_size,
      **common,
    )
  )
  return plan


class VirtualLSTMNetworks(_LateralNetworks):
  """VIRTUAL's recurrent next-character server network and one client's network.

  Inputs are character ids `x` (`[batch, T]`, integer or float). With
  `L = len(lstm_units)` Bayesian LSTMs, depth 0 the embedding and depth `L + 1` the
  logits:

  ```none
  server:  e_s = E_s[x];   h_s^k = LSTM_s^k(h_s^(k-1)), h_s^0 = e_s;
           logits_s = W_s h_s^L + b_s
  client:  e_c = E_c[x] + lat_0(e_s)
           h_c^k = LSTM_c^k(h_c^(k-1)) + lat_k(h_s^k),   h_c^0 = e_c
           logits_c = W_c h_c^L + b_c + lat_(L+1)(logits_s)
  lat_l(h) = g_l * (U_l act(V_l h + c_l) + d_l)      (at every time step)
  ```

  `E` are `GaussianEmbedding` tables (`embedding_dim`, default 8), the LSTMs
  `BayesianLSTM` (one weight draw per call, shared across time steps and the batch,
  Fortunato et al. [3]) and `W, b` a `BayesianDense` logits layer over the whole
  vocabulary.

  **Lateral form.** Every client layer's *output* sequence receives the gated
  adapter of the server output at the same depth before it is passed on, so the
  server's LSTM outputs enter the client's next LSTM through its *input* kernel (the
  Progressive-Networks adapter [(Rusu et al., 2016)][2] with the server column's
  features as extra input to the next client layer). The client LSTM itself stays a
  plain `BayesianLSTM`: the lateral does not enter its gates at the same depth, which
  would need a second input path through the recurrence. At the embedding the
  lateral maps the server embedding into the client's, at the logits the server
  logits into the client's, as in `tfbfl.models.VirtualNetworks`. The adapters
  (`LateralConnection`, `BayesianDense` maps on the last axis) use local
  reparameterization independently at each time step, unlike the LSTM weights:
  cheaper, and the per-step marginals are exact. With all gates at zero the client
  network is independent of the server parameters.

  `return_sequences=False` (default) predicts the character following each
  sequence (LEAF Shakespeare as `tfbfl.data.shakespeare` loads it: 80 ids in, one
  label out, so logits are `[batch, vocab_size]` and labels `[batch]`, the data
  layout of the other tasks);
  `True` predicts at every step (`[batch, T, vocab_size]`, labels `[batch, T]`;
  mask padding in the loss).

  Parameters, seeds and the natural-parameter interface are those of
  `tfbfl.models.VirtualNetworks`: `shared_posterior()` is a `NaturalGaussian` over
  `[embeddings, kernel_1, recurrent_kernel_1, bias_1, ..., kernel, bias]` of the
  server layers; `private_trainable_variables` are the client layers' posterior
  variables, then per depth the lateral's `V`, `U`, gate. All variables are created
  in `__init__`, deterministically in `seed`, with the values of
  `initial_shared_posterior_lstm` and `initial_private_weights_lstm`.

  Args:
    vocab_size: positive int; default 88 = the 86 characters of VIRTUAL's
      Shakespeare task plus a padding and an out-of-vocabulary id, the id layout
      of `tfbfl.data.shakespeare` (0 padding, 1..86 characters, 87 OOV).
    embedding_dim: positive int, embedding width (8 in VIRTUAL).
    lstm_units: non-empty sequence of positive ints, one LSTM layer each.
    return_sequences: bool, see above.
    forget_bias: constant added to every LSTM's forget gate (see `BayesianLSTM`).
    adapter_activation: Keras activation of the adapters' hidden layer.
    prior_scale: standard deviation of the zero-mean priors.
    init_scale: initial posterior standard deviation of every Bayesian weight.
    adapter_units: width of every adapter's hidden layer; `None` uses the width of
      the client layer it feeds.
    gate_init: initial value of every lateral gate.
    seed: Python int (or `None` for unseeded initialisation).
    name: module name.

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl import architectures

  net = architectures.VirtualLSTMNetworks(vocab_size=20, lstm_units=(6, 6))
  x = tf.random.uniform([3, 10], maxval=20, dtype=tf.int32)
  server_logits, client_logits = net.forward(x, seed=tf.constant([0, 1]))  # [3, 20]
  kl = net.kl_shared() + net.kl_private()
  s = net.shared_posterior()                    # [embeddings, k1, r1, b1, ..., k, b]
  ```

  #### References

  [1]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  [2]: Andrei A. Rusu et al. Progressive Neural Networks.
       https://arxiv.org/abs/1606.04671
  [3]: Meire Fortunato, Charles Blundell, Oriol Vinyals. Bayesian Recurrent Neural
       Networks. https://arxiv.org/abs/1704.02798
  [4]: Luke Vilnis, Andrew McCallum. Word Representations via Gaussian Embedding.
       https://arxiv.org/abs/1412.6623
  """

  def __init__(
    self,
    vocab_size=DEFAULT_VOCAB_SIZE,
    embedding_dim=8,
    lstm_units=(100, 100),
    return_sequences=False,
    forget_bias=1.0,
    adapter_activation="relu",
    prior_scale=1.0,
    init_scale=1e-3,
    adapter_units=None,
    gate_init=1.0,
    seed=0,
    name=None,
  ):
    super().__init__(name=name)
    plan = _lstm_plan(
      vocab_size, embedding_dim, lstm_units, return_sequences, forget_bias,
      adapter_activation, prior_scale, init_scale, adapter_units, gate_init, seed,
    )
    self.vocab_size = int(vocab_size)
    self.num_classes = self.vocab_size
    self.embedding_dim = int(embedding_dim)
    self.lstm_units = tuple(int(u) for u in lstm_units)
    self.return_sequences = bool(return_sequences)
    self._build_plan(plan)



def initial_shared_posterior_lstm(
  vocab_size=DEFAULT_VOCAB_SIZE,
  embedding_dim=8,
  lstm_units=(100, 100),
  init_scale=1e-3,
  seed=0,
):
  """`VirtualLSTMNetworks(..., seed=seed).shared_posterior()` without a model.

  Stateless ops only: deterministic in `seed`, usable eagerly or in a graph/TFF
  computation. (`return_sequences` and `forget_bias` do not change parameters.)
  """
  plan = _lstm_plan(
    vocab_size, embedding_dim, lstm_units, False, 1.0, "relu", 1.0, init_scale,
    None, 1.0, seed,
  )
  return _initial_shared_posterior(plan)


def initial_private_weights_lstm(
  vocab_size=DEFAULT_VOCAB_SIZE,
  embedding_dim=8,
  lstm_units=(100, 100),
  init_scale=1e-3,
  adapter_units=None,
  gate_init=1.0,
  seed=0,
):
  """`VirtualLSTMNetworks(..., seed=seed).get_private_weights()` without a model.

  Stateless ops only, deterministic in `seed`; numpy arrays when executing
  eagerly, tensors inside a graph.
  """
  plan = _lstm_plan(
    vocab_size, embedding_dim, lstm_units, False, 1.0, "relu", 1.0, init_scale,
    adapter_units, gate_init, seed,
  )
  return _initial_private_weights(plan)


def build_deterministic_lstm(
  vocab_size=DEFAULT_VOCAB_SIZE,
  embedding_dim=8,
  lstm_units=(100, 100),
  seed=0,
  return_sequences=False,
  sequence_length=None,
):
  """The point-estimate next-character model with the server network's shapes.

  `Input([sequence_length])` of ids (float ids are cast by the embedding),
  `Embedding(vocab_size, embedding_dim)`, the `LSTM` layers (Keras defaults:
  `sigmoid`/`tanh`, `unit_forget_bias=True`, the counterpart of `BayesianLSTM`'s
  `forget_bias=1`), and a linear `Dense(vocab_size)` on the last step (or on every
  step with `return_sequences=True`). Kernels Glorot-normal, recurrent kernels
  orthogonal, all seeded from `seed` (deterministic). `model.weights` are in the
  order and shapes of `VirtualLSTMNetworks.shared_posterior()`.
  """
  vocab_size, embedding_dim, lstm_units = _lstm_geometry(
    vocab_size, embedding_dim, lstm_units, return_sequences
  )
  if sequence_length is not None:
    sequence_length = check_positive_int("sequence_length", sequence_length)
  seed = check_seed(seed)
  glorot = lambda l: tf.keras.initializers.GlorotNormal(seed=derive_seed(seed, _SERVER, l))
  layers = [
    tf.keras.Input(shape=(sequence_length,)),
    tf.keras.layers.Embedding(
      vocab_size, embedding_dim, embeddings_initializer=glorot(0), name="embedding"
    ),
  ]
  for k, units in enumerate(lstm_units):
    layers.append(
      tf.keras.layers.LSTM(
        units,
        return_sequences=return_sequences or k < len(lstm_units) - 1,
        kernel_initializer=glorot(k + 1),
        recurrent_initializer=tf.keras.initializers.Orthogonal(
          seed=derive_seed(seed, _SERVER, k + 1, 1)
        ),
        name=f"lstm_{k}",
      )
    )
  layers.append(
    tf.keras.layers.Dense(
      vocab_size, kernel_initializer=glorot(len(lstm_units) + 1), name="logits"
    )
  )
  return tf.keras.Sequential(layers, name="deterministic_lstm")
