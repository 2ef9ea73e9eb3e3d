"""Every launcher runs end to end with the tiniest settings, on bundled digits or
on tiny files in the publisher's format, and fails with the loader's documented
message when its data files are missing. Each run is a subprocess (as a user runs
it), so the session guard also checks that launchers leave no process behind. The
two grid launchers share one output directory: the second finds its one cell
finished by the first (the grid's resume) and reports it."""

import os
import subprocess
import sys

import pytest

from datafiles import make_mnist_arrays, write_mnist

_TINY = ["--rounds=1", "--epochs_per_round=1", "--num_clients=2", "--clients_per_round=2"]


def _run(module, *args, timeout=240):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, "-m", module, *args],
                        capture_output=True,
                        text=True,
                        timeout=timeout,
                        env=env,
                        stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
  return write_mnist(tmp_path_factory.mktemp("mnist"), make_mnist_arrays(n_train=120, n_test=40))


def test_train_on_mnist_files(mnist_dir, tmp_path):
  # No SavedModels: the export through launchers.train is test_export.py's.
  out = _run("launchers.train", "--dataset=mnist", f"--data_dir={mnist_dir}", *_TINY,
             "--hidden_units=8", "--export=false", f"--output_dir={tmp_path}")
  assert out.returncode == 0, out.stderr[-2000:]
  assert "best S accuracy" in out.stdout
  assert (tmp_path / "summary.json").exists()


def test_dataset_stats_on_mnist_files(mnist_dir):
  out = _run("launchers.dataset_stats", "--dataset=mnist", f"--data_dir={mnist_dir}",
             "--num_clients=4")
  assert out.returncode == 0, out.stderr[-2000:]
  assert "mnist" in out.stdout


@pytest.mark.parametrize("module, args, names", [
    ("launchers.train", ["--dataset=mnist", "--data_dir={missing}"], "train-images-idx3-ubyte"),
    ("launchers.train", ["--dataset=cifar10", "--data_dir={missing}"], "data_batch_1"),
    ("launchers.virtual_table4", [
        "--output_dir={out}", "--fixed=data_dir={missing}", "--algorithms=virtual", "--rounds=1"
    ], "femnist"),
])
def test_missing_files_give_the_documented_message(module, args, names, tmp_path):
  missing = tmp_path / "no_such_dir"
  args = [a.format(missing=missing, out=tmp_path / "out") for a in args]
  out = _run(module, *args)
  assert out.returncode != 0
  assert names in out.stderr.lower() or names in out.stderr, out.stderr[-2000:]


_GRID = ["--rounds=1", "--epochs_per_round=1", "--num_clients=3", "--clients_per_round=3",
         "--datasets=digits_dirichlet", "--kl_weights=1e-4", "--fixed=hidden_units=8"]
# In this order, into one --output_dir: v1_table2 trains its four cells (Local, Global,
# FedAvg, VIRTUAL at fig2's defaults: client lr 0.05, VIRTUAL step 0.1); fig2 (one beta:
# a line per beta is test_grid.py's, in-process, three betas) plans the same VIRTUAL
# cell, finds it finished with the same flags (the grid's resume) and writes its report.
_GRID_LAUNCHERS = {
    "launchers.virtual_v1_table2": (["--seeds=0", "--client_lrs=0.05", "--virtual_server_lrs=0.1",
                                     "--server_lrs=1.0"], "grid: 4 cells, 0 already done, 4 to run"),
    "launchers.virtual_fig2": ([], "grid: 1 cells, 1 already done, 0 to run"),
}


@pytest.fixture(scope="module")
def grid_runs(tmp_path_factory):
  """`{module: (completed process, its table2.md or None)}` of the grid launchers, run
  one after the other in one --output_dir (each launcher's table2.md is read, then
  removed before the next one runs)."""
  out = tmp_path_factory.mktemp("grid")
  runs = {}
  for module, (extra, _) in _GRID_LAUNCHERS.items():
    run = _run(module, f"--output_dir={out}", *_GRID, *extra, timeout=400)
    table = out / "table2.md"
    runs[module] = (run, table.read_text() if table.exists() else None)
    if table.exists():
      table.unlink()
  return runs


@pytest.mark.parametrize("module", list(_GRID_LAUNCHERS))
def test_grid_launchers_on_digits(grid_runs, module):
  out, table = grid_runs[module]
  assert out.returncode == 0, out.stderr[-3000:]
  assert _GRID_LAUNCHERS[module][1] in out.stdout, out.stdout[-3000:]
  assert table is not None


def test_fola_first_round_on_digits(tmp_path):
  out = _run("launchers.fola_first_round", f"--output_dir={tmp_path}", "--sweep=alpha",
             "--alphas=0.1", "--repeats=1", "--num_clients=3", "--epochs_per_round=1",
             "--hidden_units=8", "--methods=fola")  # every method in-process: test_fola.py
  assert out.returncode == 0, out.stderr[-3000:]
  assert any(p.suffix == ".csv" for p in tmp_path.iterdir())
  assert any(p.suffix == ".png" for p in tmp_path.iterdir())


def test_fola_curves_on_digits(tmp_path):
  out = _run("launchers.fola_curves", f"--output_dir={tmp_path}", "--alphas=0.1", "--rounds=1",
             "--num_clients=3", "--epochs_per_round=1", "--hidden_units=8", "--methods=fola")
  assert out.returncode == 0, out.stderr[-3000:]
  assert list(tmp_path.rglob("summary.json"))


def test_demo_prints_s_and_mt_for_both(tmp_path):
  out = _run("launchers.demo", "--rounds=1", f"--output_dir={tmp_path}")
  assert out.returncode == 0, out.stderr[-3000:]
  lines = [l for l in out.stdout.splitlines() if l.startswith(("virtual ", "fedavg "))]
  assert len(lines) == 2, out.stdout[-2000:]
