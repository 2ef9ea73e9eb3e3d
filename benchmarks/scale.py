"""VIRTUAL at K = 100, 1,000, 10,000 clients: seconds per round and peak memory.

Problem (digits-sized): the 1,797 scikit-learn digits (64 features, 10 classes)
resampled into K clients: client i draws n_i ~ U{20, ..., 50} examples with
replacement from a class mixture ~ Dirichlet(0.5) (seeded by i), and keeps
`floor(0.25 n_i + 0.5)` of them for test (`from_client_arrays`). VIRTUAL with
the launcher's network (MLP 64-100-100-10 + private network and laterals),
C = min(100, K) clients a round, batch 20, client lr 0.05, alpha = 1/C, and
**E = 1 local epoch** (not the default 20: on 2 cores 100 clients x 20 epochs
would take minutes a round), `--client_store=disk` (fsync on), evaluation
after every round with the streamed, cached evaluation (`--eval_chunk`, default 64).

Each K runs in its own process (so peak memory is that K's); peak RSS is
sampled every 50 ms over the process *and its children* (TFF's worker binary),
so it includes TFF. Columns:

* `round_s`: seconds of one round's training (`next`, the state writes);
* `eval_s`: seconds of the evaluation after it (round 1: every client's MT is
  computed once, the never-trained ones from their initial state; round 2:
  only the C clients trained in round 2);
* `peak_rss_MB`, `rss/client_KB` = peak RSS / K, `stored` = clients with a state
  file, `disk/stored_MB`.

`--legacy_k=200` adds a row with the old single-call evaluation
(`eval_chunk = 0`: every client's state in one TFF call, all stored) for the
before/after comparison.

    .venv/bin/python -m benchmarks.scale                # K = 100, 1000, 10000
    .venv/bin/python -m benchmarks.scale --ks=100,1000 --rounds=1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_data(k: int, seed: int = 0, sizes=(20, 50)):
  import numpy as np  # pylint: disable=g-import-not-at-top

  from tfbfl.data import digits, federated  # pylint: disable=g-import-not-at-top

  x, y = digits.load_digits_arrays()
  by_class = [np.flatnonzero(y == c) for c in range(10)]
  xs, ys = [], []
  for i in range(k):
    rng = np.random.default_rng([seed, i])
    n = int(rng.integers(sizes[0], sizes[1] + 1))
    mix = rng.dirichlet(np.full(10, 0.5))
    classes = rng.choice(10, size=n, p=mix)
    idx = np.array([rng.choice(by_class[c]) for c in classes])
    xs.append(x[idx])
    ys.append(y[idx])
  return federated.from_client_arrays(xs,
                                      ys,
                                      num_classes=10,
                                      test_fraction=0.25,
                                      seed=seed,
                                      name=f"digits_resampled_{k}")


class PeakRss:
  """Peak of (RSS of this process + its children), sampled in a thread."""

  def __init__(self, interval=0.05):
    import psutil  # pylint: disable=g-import-not-at-top

    self._me = psutil.Process()
    self.peak = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
    self._thread.start()

  def sample(self):
    total = 0
    for p in [self._me] + self._me.children(recursive=True):
      try:
        total += p.memory_info().rss
      except Exception:  # pylint: disable=broad-except
        pass
    self.peak = max(self.peak, total)
    return total

  def _run(self, interval):
    while not self._stop.wait(interval):
      self.sample()

  def stop(self):
    self._stop.set()
    self._thread.join()
    self.sample()
    return self.peak


def run_one(k: int, rounds: int, epochs: int, eval_chunk: int) -> dict:
  rss = PeakRss()
  from tfbfl import client_store, round_loop, runtime, driver  # pylint: disable=g-import-not-at-top
  from tfbfl.algorithms import registry, virtual  # pylint: disable=g-import-not-at-top

  runtime.set_local_runtime()
  t0 = time.time()
  data = make_data(k)
  c = min(100, k)
  p = driver.resolve_params(
      dict(algorithm="virtual",
           num_clients=k,
           clients_per_round=c,
           epochs_per_round=epochs,
           rounds=rounds))
  algorithm = virtual.VirtualAlgorithm(registry.get("virtual").make_config(p, data))
  setup_s = time.time() - t0
  with tempfile.TemporaryDirectory(prefix="tfbfl-scale-") as out:
    config = round_loop.RunConfig(rounds=rounds,
                                  clients_per_round=c,
                                  seed=0,
                                  output_dir=out,
                                  verbose=False,
                                  client_store="disk",
                                  eval_chunk=eval_chunk,
                                  export=False)  # measures rounds and evaluation only
    runner = round_loop.ExperimentRunner(algorithm, data, config)
    evals, marks = [], [time.time()]
    evaluate = runner.evaluate

    def timed_evaluate(state):
      t = time.time()
      marks.append(t)
      result = evaluate(state)
      evals.append(time.time() - t)
      return result

    runner.evaluate = timed_evaluate
    runner.run()
    # round r's training: from the end of evaluation r-1 (or the start) to the start of evaluation r
    train = [
        marks[r + 1] - (marks[0] if r == 0 else marks[r] + evals[r - 1]) for r in range(rounds)
    ]
    store = client_store.DiskClientStore(os.path.join(out, "client_states"))
    stored = len(store)
    disk = store.nbytes()
    peak = rss.stop()
  runtime.shutdown()
  return dict(k=k,
              c=c,
              epochs=epochs,
              eval_chunk=eval_chunk,
              setup_s=setup_s,
              round_s=train,
              eval_s=evals,
              peak_rss_MB=peak / 2**20,
              rss_per_client_KB=peak / 1024 / k,
              stored=stored,
              disk_per_stored_MB=disk / max(stored, 1) / 2**20,
              examples=int(
                  sum(len(data.train[i][1]) + len(data.test[i][1]) for i in data.client_ids)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--ks", default="100,1000,10000")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--eval_chunk", type=int, default=64)
  parser.add_argument("--legacy_k",
                      type=int,
                      default=0,
                      help="also run the single-call evaluation (eval_chunk=0) at this K")
  parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--budget_s",
                      type=float,
                      default=15 * 60,
                      help="skip the remaining K once this much time is spent")
  args = parser.parse_args()
  if args.one:
    print("RESULT " + json.dumps(run_one(args.one, args.rounds, args.epochs, args.eval_chunk)),
          flush=True)
    return
  runs = [(int(k), args.eval_chunk) for k in args.ks.split(",")]
  if args.legacy_k:
    runs.insert(0, (args.legacy_k, 0))
  start, results = time.time(), []
  for k, chunk in runs:
    if time.time() - start > args.budget_s:
      print(f"K={k}: skipped (the {args.budget_s:.0f} s budget is spent)", flush=True)
      continue
    cmd = [
        sys.executable, "-m", "benchmarks.scale", f"--one={k}", f"--rounds={args.rounds}",
        f"--epochs={args.epochs}", f"--eval_chunk={chunk}"
    ]
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode or not lines:
      print(f"K={k} eval_chunk={chunk}: failed (rc {proc.returncode})\n{proc.stderr[-2000:]}")
      continue
    r = json.loads(lines[-1][7:])
    r["process_s"] = time.time() - t
    results.append(r)
    print(f"K={k} eval_chunk={chunk} done in {r['process_s']:.0f} s", flush=True)
  load = os.getloadavg()[0]
  print(f"\nVIRTUAL, disk store, C=min(100,K), E={args.epochs}, B=20, MLP 64-100-100-10; "
        f"{os.cpu_count()} cores, load {load:.1f}")
  head = (f"{'K':>6} {'chunk':>5} {'round_s':>15} {'eval_s':>15} {'peak_rss_MB':>11} "
          f"{'rss/client_KB':>13} {'stored':>6} {'disk/stored_MB':>14} {'process_s':>9}")
  print(head)
  for r in results:
    fmt = lambda v: "/".join(f"{x:.1f}" for x in v)
    print(f"{r['k']:>6} {r['eval_chunk']:>5} {fmt(r['round_s']):>15} {fmt(r['eval_s']):>15} "
          f"{r['peak_rss_MB']:>11.0f} {r['rss_per_client_KB']:>13.1f} {r['stored']:>6} "
          f"{r['disk_per_stored_MB']:>14.2f} {r['process_s']:>9.0f}")
  print("round_s / eval_s: per round (round 1 / round 2); chunk 0 = the single-call evaluation.")


if __name__ == "__main__":
  main()
