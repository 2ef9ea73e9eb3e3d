"""`DataSpec`: the data settings, from the flags to the loaders, in one object.

Every launcher flag that chooses or splits the data is a field here (its default,
help text and check live nowhere else); `tfbfl.data.load_federated(spec)` hands
them to the dataset's loader.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tfbfl import options
from tfbfl.data import federate


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Which dataset, from where, split how (`tfbfl.data.registry` lists the names)."""
  dataset: str = options.text("digits", "Dataset name (digits needs no files; see data/README.md).")
  data_dir: Optional[str] = options.text(None,
                                         "File or directory of the dataset (see data/README.md).")
  partition: str = options.choice("class_dirichlet", federate.PARTITIONS,
                                  "How pooled data is split over clients.")
  num_clients: int = options.integer(10, "Number of clients K.", low=1, high=10**7)
  alpha: float = options.real(0.5,
                              "Dirichlet concentration of the partition.",
                              low_open=True,
                              high=1e9)
  min_size: int = options.integer(10, "Minimum client size (class_dirichlet).")
  classes_per_client: int = options.integer(2,
                                            "Classes per client (pathological).",
                                            low=1,
                                            high=10**6)
  test_fraction: float = options.real(0.25,
                                      "Per-client held-out fraction where a dataset has no split.",
                                      high=0.99)
  validation_fraction: float = options.real(
      0.0,
      "Tuning: hold out this fraction of each client's training data as its test data "
      "(the real test data are not used); 0 = off.",
      high=0.9)
  calibration_fraction: float = options.real(
      0.0,
      "Hold out this fraction of each client's training data, never trained on, as its "
      "calibration split (read by --temperature_scaling); 0 = off.",
      high=0.9)
  seed: int = 0  # the run's --seed: the same seed gives identical data

  def __post_init__(self):
    # Values are checked by the flags (`driver.resolve_params`) and, with the
    # loaders' own messages, by the loaders; the partition name by both.
    federate.check_partition(self.partition)
