"""scikit-learn's bundled handwritten digits: the no-download default dataset.

1797 real 8x8 grey-level images of the digits 0-9 (the UCI "Optical
Recognition of Handwritten Digits" test set), shipped inside scikit-learn, so
nothing is downloaded.
"""

import numpy as np

NUM_CLASSES = 10
INPUT_SHAPE = (64,)


def load_digits_arrays():
  """Returns (x, y): x float32 [1797, 64] in [0, 1] (pixels / 16), y int32 [1797]."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  bunch = datasets.load_digits()
  x = np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)
  y = np.asarray(bunch.target, dtype=np.int32)
  return x, y
