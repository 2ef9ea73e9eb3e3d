"""McMahan et al. CNN: layer shapes, determinism in the seed, input validation."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfbfl import networks  # noqa: E402


def test_cifar_shapes_and_parameter_count():
  model = networks.build_mcmahan_cnn((32, 32, 3), 10, seed=0)
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  assert shapes == [(5, 5, 3, 32), (32,), (5, 5, 32, 64), (64,), (8 * 8 * 64, 512), (512,),
                    (512, 10), (10,)]
  # McMahan et al. report about 1.66M parameters for the 28x28 MNIST variant;
  # for 32x32x3 inputs: 2432 + 51264 + 2097664 + 5130.
  assert model.count_params() == 2432 + 51264 + 2097664 + 5130
  assert model(tf.zeros([2, 32, 32, 3])).shape == (2, 10)


def test_two_dimensional_input_gets_one_channel_and_seed_is_deterministic():
  a = networks.build_mcmahan_cnn((8, 8), 4, seed=3)
  b = networks.build_mcmahan_cnn((8, 8), 4, seed=3)
  c = networks.build_mcmahan_cnn((8, 8), 4, seed=4)
  assert a.input_shape == (None, 8, 8, 1)
  for wa, wb in zip(a.get_weights(), b.get_weights()):
    np.testing.assert_array_equal(wa, wb)
  assert not np.allclose(a.get_weights()[0], c.get_weights()[0])
  assert np.all(a.get_weights()[1] == 0)


@pytest.mark.parametrize("shape", [(8,), (8, 8, 1, 1), 8, (0, 8)])
def test_bad_input_shape_is_rejected(shape):
  with pytest.raises(ValueError, match="input_shape"):
    networks.build_mcmahan_cnn(shape, 10)
