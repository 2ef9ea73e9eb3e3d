"""Convolutional networks: VIRTUAL's conv family and FOLA's McMahan CNN.

* `VirtualConvNetworks`: the FEMNIST conv net of VIRTUAL (two 5x5 Bayesian
  convolutions with 32 and 64 filters, 2x2 max-pooling after each, then the 2x100
  MLP and the logits) as a server network plus one client's laterally connected
  private network, with the interface of `tfbfl.networks.mlp.VirtualNetworks`.
* `initial_shared_posterior_conv`, `initial_private_weights_conv`: the initial
  values of a fresh `VirtualConvNetworks`, from stateless ops only, deterministic
  in `seed`.
* `build_deterministic_conv`: the point-estimate Keras model (logits) with the
  server network's shapes, for FedAvg/FedProx/FOLA (`--architecture=conv`).
* `build_mcmahan_cnn`: the CNN of McMahan et al. (2017) of FOLA's CIFAR-10
  experiments (`--architecture=cnn`).

`VirtualConvNetworks` is `tfbfl.networks.progressive.ProgressiveNetworks` of the
built-in conv net (`builders.ConvNet`), the construction a user's `--model` takes.
The two Keras models are the built-in builders of `tfbfl.networks.builders`
(`ConvNet`, `McMahanCNN`) built through their templates, seeded by the rule of
`tfbfl.models`: one definition, the one the algorithms train.
"""

import numpy as np

from tfbfl.layers.base import check_positive_int, check_seed, is_int
from tfbfl.layers.conv import conv_output_size
from tfbfl.networks import builders, progressive
from tfbfl.networks.base import positive_ints

__all__ = [
    "VirtualConvNetworks",
    "build_deterministic_conv",
    "build_mcmahan_cnn",
    "initial_private_weights_conv",
    "initial_shared_posterior_conv",
]


def _image_shape(input_shape):
  """`(H, W, C)` from `(H, W)` (one channel) or `(H, W, C)`."""
  try:
    dims = tuple(input_shape)
  except TypeError:
    dims = None
  if dims is None or len(dims) not in (2, 3) or not all(is_int(d) and d > 0 for d in dims):
    raise ValueError("`input_shape` must be the image shape (height, width) or (height, width, "
                     f"channels) of positive ints, got {input_shape!r}.")
  dims = tuple(int(d) for d in dims)
  return dims if len(dims) == 3 else dims + (1,)


# -- VIRTUAL's convolutional networks ---------------------------------------------


def _conv_geometry(input_shape, filters, kernel_size, pool_size, padding):
  """Per conv stage `(in_shape, conv_out_shape, pooled_shape)`, checked."""
  image = _image_shape(input_shape)
  filters = positive_ints("filters", filters)
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
      raise ValueError(f"`input_shape` {tuple(input_shape)} is too small for {len(filters)} "
                       f"{kernel_size}x{kernel_size} '{padding}' convolutions with "
                       f"{pool_size}x{pool_size} pooling.")
    stages.append(((h, w, c), (ch, cw, f), (ph, pw, f)))
    h, w, c = ph, pw, f
  return image, filters, kernel_size, pool_size, padding.lower(), stages, h * w * c


def _template(input_shape, num_classes, filters, kernel_size, pool_size, padding, hidden_units,
              activation="relu"):
  """The built-in conv net's template reading images of `input_shape` (flattened
  examples with as many entries work too: the template starts with a `Reshape`)."""
  image, filters, kernel_size, pool_size, padding, _, _ = _conv_geometry(
      input_shape, filters, kernel_size, pool_size, padding)
  builder = builders.ConvNet(image, image, check_positive_int("num_classes", num_classes),
                             filters, kernel_size, pool_size, padding,
                             hidden_units=positive_ints("hidden_units", hidden_units),
                             activation=activation)
  return builders.template_for(builder, architecture="conv", input_shape=image,
                               num_classes=builder.num_classes)


class VirtualConvNetworks(progressive.ProgressiveNetworks):
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
  then both flatten and continue as tfbfl.networks.mlp.VirtualNetworks:
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
  `tfbfl.networks.mlp.VirtualNetworks`.

  The default geometry is the FEMNIST network of VIRTUAL [(Corinzia et al.,
  2019)][1], Section IV-B: two `5 x 5` convolutions with 32 and 64 filters, 'same'
  padding (28x28 -> 14x14 -> 7x7; the 8x8 bundled digits give 4x4 -> 2x2), 2x2
  max-pooling after each, then the MLP with `hidden_units = (100, 100)` on the
  flattened maps.

  Parameters, seeds and the natural-parameter interface are those of
  `tfbfl.networks.mlp.VirtualNetworks`: `shared_posterior()` is a `NaturalGaussian` over
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
  from tfbfl import networks

  net = networks.VirtualConvNetworks(
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
    if adapter_units is not None:
      adapter_units = check_positive_int("adapter_units", adapter_units)
    tmpl = _template(input_shape, num_classes, filters, kernel_size, pool_size, padding,
                     hidden_units, activation)
    super().__init__(tmpl,
                     activation=activation,
                     prior_scale=prior_scale,
                     init_scale=init_scale,
                     adapter_units=adapter_units,
                     gate_init=gate_init,
                     seed=check_seed(seed),
                     name=name)
    self.filters = tuple(int(f) for f in filters)
    self.hidden_units = tuple(int(h) for h in hidden_units)


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
  tmpl = _template(input_shape, num_classes, filters, kernel_size, pool_size, padding,
                   hidden_units)
  return progressive.initial_shared_posterior_of(tmpl, init_scale, check_seed(seed))


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
  tmpl = _template(input_shape, num_classes, filters, kernel_size, pool_size, padding,
                   hidden_units)
  return progressive.initial_private_weights_of_template(tmpl, init_scale, adapter_units,
                                                         gate_init, seed)


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
  image. Glorot-normal kernels seeded from `seed` (`builders.ConvNet` through its
  template, seeded by the rule of `tfbfl.models`: deterministic in `seed`), zero
  biases; `model.weights` are in the order and shapes
  of `VirtualConvNetworks.shared_posterior()`. Build it where it is used (inside the
  TFF computation when it is used there: see the `_assert_built_as_v1` pitfall in
  the SPEC).
  """
  image, filters, kernel_size, pool_size, padding, _, _ = _conv_geometry(
      input_shape, filters, kernel_size, pool_size, padding)
  num_classes = check_positive_int("num_classes", num_classes)
  hidden = positive_ints("hidden_units", hidden_units)
  seed = check_seed(seed)
  data_shape = image if data_shape is None else tuple(data_shape)
  if int(np.prod(data_shape)) != int(np.prod(image)):
    raise ValueError(f"`data_shape` {data_shape} must have as many entries as the image {image}.")
  builder = builders.ConvNet(data_shape, image, num_classes, filters, kernel_size, pool_size,
                             padding, hidden_units=hidden, activation=activation)
  return builders.template_for(builder,
                               architecture="conv",
                               input_shape=data_shape,
                               num_classes=num_classes).build(seed)


# -- FOLA's McMahan et al. CNN ------------------------------------------------------


def build_mcmahan_cnn(input_shape, num_classes, seed=0):
  """The CNN of McMahan et al. (2017), used by FOLA's CIFAR-10 experiments.

  A plain (point-estimate) convolutional network, the model FOLA and its
  baselines train on CIFAR-10; the flag value naming it is `--architecture=cnn`
  (`tfbfl.algorithms.fola`'s `network == "cnn"`), distinct from `--architecture=conv`
  (`build_deterministic_conv`, VIRTUAL's FEMNIST geometry).

  ```none
  conv 5x5, 32 filters, ReLU, 'same'  ->  max-pool 2x2
  conv 5x5, 64 filters, ReLU, 'same'  ->  max-pool 2x2
  flatten -> dense 512, ReLU -> dense num_classes (logits)
  ```

  Glorot-normal kernels seeded from `seed` by the rule of `tfbfl.models`
  (`builders.McMahanCNN` through its template: layer `k` as VIRTUAL's server layer
  `k`; before the builders it used its own salt, so the weights of a seed
  changed then), zero biases. Trainable variables come in the order
  `[conv1 kernel, conv1 bias, conv2 kernel, conv2 bias, dense kernel, dense bias,
  logits kernel, logits bias]`. As for `build_deterministic_mlp`, build it where
  it is used (inside the TFF computation when it is used there).

  Args:
    input_shape: `(height, width, channels)` (e.g. `(32, 32, 3)` for CIFAR-10) or
      `(height, width)` for single-channel images, positive ints.
    num_classes: positive int, number of logits.
    seed: Python int (or `None` for unseeded initialisation).

  Returns:
    A `tf.keras.Sequential` whose weights exist on return.

  Raises:
    ValueError: if `input_shape` is not 2 or 3 positive ints, or `num_classes`
      or `seed` is invalid.

  #### Examples

  ```python
  model = build_mcmahan_cnn((32, 32, 3), 10, seed=0)
  logits = model(tf.zeros([4, 32, 32, 3]))     # shape [4, 10]
  ```

  #### References

  [1]: H. Brendan McMahan et al. Communication-Efficient Learning of Deep
       Networks from Decentralized Data. AISTATS 2017.
  """
  if isinstance(input_shape, (int, np.integer)) or not hasattr(input_shape, "__iter__"):
    raise ValueError(f"`input_shape` must be (height, width[, channels]), got {input_shape!r}.")
  shape = [check_positive_int("input_shape", d) for d in input_shape]
  if len(shape) not in (2, 3):
    raise ValueError(
        f"`input_shape` must be (height, width[, channels]), got {tuple(input_shape)}.")
  if len(shape) == 2:
    shape.append(1)
  num_classes = check_positive_int("num_classes", num_classes)
  seed = check_seed(seed)
  return builders.template_for(None,
                               architecture="cnn",
                               input_shape=tuple(shape),
                               image_shape=tuple(shape),
                               num_classes=num_classes).build(seed)
