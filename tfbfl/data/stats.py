"""Dataset statistics in the shape of Table I of the VIRTUAL paper.

Table I reports, per dataset: K (clients), Size, and the mean and std of the
per-client size (Size/K). We add the number of classes and the mean number of
distinct classes per client, which measures label heterogeneity.
"""

import numpy as np

STAT_SPLITS = ("train", "test", "all")


def _client_labels(fd, cid, split):
  if split == "all":
    return np.concatenate([fd.train[cid][1], fd.test[cid][1]])
  return (fd.train if split == "train" else fd.test)[cid][1]


def dataset_statistics(fd, split="train"):
  """Returns the Table I statistics of `fd` as a dict.

  Keys: `dataset` (name), `num_clients` (K), `total_samples` (train + test),
  `train_samples`, `test_samples`, `split` (the split the per-client numbers
  use), `samples_per_client_mean`, `samples_per_client_std` (population std,
  ddof=0, so equal clients give 0 as in Table I), `num_classes`,
  `classes_per_client_mean` (mean number of distinct labels per client).

  Args:
    fd: a `FederatedData`.
    split: "train" (default, as Table I's per-client sizes), "test" or "all".
  """
  if split not in STAT_SPLITS:
    raise ValueError(f"`split` must be one of {STAT_SPLITS}, got {split!r}.")
  labels = [_client_labels(fd, c, split) for c in fd.client_ids]
  sizes = np.array([y.size for y in labels], dtype=np.float64)
  classes = np.array([np.unique(y).size for y in labels], dtype=np.float64)
  train = sum(fd.train[c][1].size for c in fd.client_ids)
  test = sum(fd.test[c][1].size for c in fd.client_ids)
  return {
      "dataset": fd.name,
      "num_clients": len(fd.client_ids),
      "total_samples": int(train + test),
      "train_samples": int(train),
      "test_samples": int(test),
      "split": split,
      "samples_per_client_mean": float(sizes.mean()),
      "samples_per_client_std": float(sizes.std()),
      "num_classes": int(fd.num_classes),
      "classes_per_client_mean": float(classes.mean()),
  }


def format_table1(fd, split="train"):
  """Formats one `FederatedData` (or a list of them) as a Table I text table.

  Columns: Dataset, K, Size (train + test), Train, Test, the mean and std of
  the per-client size on `split`, Classes, and mean Classes/K.
  """
  fds = fd if isinstance(fd, (list, tuple)) else [fd]
  label = split.capitalize()
  header = [
      "Dataset", "K", "Size", "Train", "Test", f"{label}/K mean", f"{label}/K std", "Classes",
      "Classes/K mean"
  ]
  rows = []
  for one in fds:
    s = dataset_statistics(one, split)
    rows.append([
        s["dataset"],
        str(s["num_clients"]),
        str(s["total_samples"]),
        str(s["train_samples"]),
        str(s["test_samples"]), f"{s['samples_per_client_mean']:.1f}",
        f"{s['samples_per_client_std']:.1f}",
        str(s["num_classes"]), f"{s['classes_per_client_mean']:.2f}"
    ])
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

  def line(cells):
    first = cells[0].ljust(widths[0])
    rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
    return "  ".join([first] + rest)

  rule = "-" * len(line(header))
  return "\n".join([line(header), rule] + [line(r) for r in rows])
