"""Tests of the Table I statistics and the dataset_stats launcher."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfbfl.data import from_client_arrays
from tfbfl.data import stats

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(name="fd")
def fd_fixture():
  # Hand-made: train sizes 2, 4, 6 with 1, 2, 3 distinct classes; tests 1, 1, 0.
  ys = [np.array([0, 0]), np.array([0, 1, 1, 0]), np.array([0, 1, 2, 2, 1, 0])]
  xs = [np.ones((y.size, 2)) for y in ys]
  yt = [np.array([3]), np.array([0]), np.zeros(0, int)]
  xt = [np.ones((y.size, 2)) for y in yt]
  return from_client_arrays(xs, ys, xt, yt, num_classes=5, name="hand")


def test_statistics_match_hand_computation(fd):
  s = stats.dataset_statistics(fd)
  assert s == {
      "dataset": "hand",
      "num_clients": 3,
      "total_samples": 14,
      "train_samples": 12,
      "test_samples": 2,
      "split": "train",
      "samples_per_client_mean": 4.0,
      "samples_per_client_std": pytest.approx(np.sqrt(8 / 3)),  # ddof=0
      "num_classes": 5,
      "classes_per_client_mean": 2.0,
  }
  s_all = stats.dataset_statistics(fd, split="all")
  assert s_all["samples_per_client_mean"] == pytest.approx(14 / 3)
  assert s_all["classes_per_client_mean"] == pytest.approx((2 + 2 + 3) / 3)
  with pytest.raises(ValueError, match=r"`split` must be one of"):
    stats.dataset_statistics(fd, split="valid")


def test_format_table1(fd):
  table = stats.format_table1([fd, fd.subset(["client_00"])])
  lines = table.splitlines()
  assert len(lines) == 4
  assert lines[0].split() == [
      "Dataset", "K", "Size", "Train", "Test", "Train/K", "mean", "Train/K", "std", "Classes",
      "Classes/K", "mean"
  ]
  assert lines[2].split() == ["hand", "3", "14", "12", "2", "4.0", "1.6", "5", "2.00"]
  assert lines[3].split() == ["hand", "1", "3", "2", "1", "2.0", "0.0", "5", "1.00"]


def test_launcher_smoke():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-m", "launchers.dataset_stats", "--num_clients=5"],
                       cwd=_ROOT,
                       env=env,
                       capture_output=True,
                       text=True,
                       timeout=120,
                       check=True).stdout
  row = out.splitlines()[2].split()
  assert row[:3] == ["digits/class_dirichlet", "5", "1797"]
