"""Metrics S and MT over every client, as the round loop computes them.

S  = the server model on every client's test data;
MT = each client's own model on its own test data (its last deployed model; a
     client never selected yet is evaluated with its initial model),

both weighted by client test-set size (`aggregate_evaluation`). Client k's
evaluation seed is `evaluation_seed(seed, k)` at every round (VIRTUAL's Monte Carlo
predictive does not read it: its noise is its exported models', keyed by the
example, `tfbfl.algorithms.virtual.evaluation`).

An algorithm with `base.SupportsStreamedEvaluation` is evaluated `chunk` clients
per call: S from the server state and the clients' test data alone; MT from each
client's state alone, loaded from the store one chunk at a time, and cached per
client when the algorithm says MT is a function of the state (`mt_cacheable`):
only clients trained since their last evaluation are recomputed. Others (and
`chunk = 0`) send every client's state in one `algorithm.evaluate` call.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from tfbfl import metrics as metrics_lib
from tfbfl import runtime
from tfbfl import temperature
from tfbfl.algorithms import base


def aggregate_evaluation(per_client: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """Weights each client's sums by its test-set size. Sums that carry temperature
  grids (`{key}_fit_nll`) are first read at the fitted temperature
  (`tfbfl.temperature.select`), reported as `{key}_temperature`."""
  n = float(sum(float(c["num_examples"]) for c in per_client))
  if n <= 0:
    raise ValueError("evaluation needs at least one test example over all clients.")
  fitted = [key for key in ("server", "mt") if all(f"{key}_fit_nll" in c for c in per_client)]
  if fitted:
    per_client = [plain_sums(c) for c in per_client]  # copies: `select` rewrites them
  temperatures = {f"{key}_temperature": temperature.select(per_client, key) for key in fitted}
  total = lambda k: float(sum(float(c[k]) for c in per_client))
  out = dict(server_accuracy=total("server_correct") / n,
             server_loss=total("server_loss") / n,
             mt_accuracy=total("mt_correct") / n,
             mt_loss=total("mt_loss") / n,
             client_mt_accuracy=[
                 float(c["mt_correct"]) / max(float(c["num_examples"]), 1.0) for c in per_client
             ])
  # Calibration bins add over clients: the ECE of the pooled test set.
  detail = {}
  for key in ("server", "mt"):
    if all(f"{key}_calibration" in c for c in per_client):
      bins = sum(np.asarray(c[f"{key}_calibration"], np.float64) for c in per_client)
      out[f"{key}_ece"] = metrics_lib.expected_calibration_error(bins)
      detail[f"{key}_bins"] = bins.tolist()
  if "mt_bins" in detail:
    detail.update(calibration_per_client(per_client))
  if detail:
    out["calibration"] = detail
  out.update(temperatures)
  return out


def calibration_per_client(per_client: Sequence[Dict[str, Any]]) -> Dict[str, List[Any]]:
  """Each client's MT NLL and ECE on its own test data (None for a client without
  test examples) and its test-set size, in client order."""
  nll, ece, sizes = [], [], []
  for c in per_client:
    n = float(c["num_examples"])
    sizes.append(int(n))
    nll.append(float(c["mt_loss"]) / n if n > 0 else None)
    ece.append(metrics_lib.expected_calibration_error(c["mt_calibration"]) if n > 0 else None)
  return dict(client_mt_nll=nll, client_mt_ece=ece, client_num_examples=sizes)


def plain_sums(result) -> Dict[str, Any]:
  """One client's evaluation sums (a dict or a struct of tensors) as a dict of
  numpy values, without `client_index`."""
  items = result.items() if hasattr(result, "items") else result._asdict().items()
  return {k: np.asarray(v) for k, v in items if k != "client_index"}


def rekey(selected: Sequence[int], results, what: str = "client states") -> list:
  """Per-client `results` in `selected` order. Results that carry `client_index`
  (an attribute, or a key of a dict) are matched by it (multi-worker contexts
  return them in completion order); others are taken in the order returned,
  which the local context keeps, and are refused under a multi-worker context."""
  results = list(results)
  if len(results) != len(selected):
    raise RuntimeError(f"{len(selected)} clients were selected but {len(results)} "
                       f"{what} came back.")
  index_of = lambda r: r.get("client_index") if isinstance(r, dict) else getattr(
      r, "client_index", None)
  indices = [index_of(r) for r in results]
  if any(i is None for i in indices):
    if len(results) > 1 and runtime.mergeable_context_active():
      raise RuntimeError(
          f"{what} came back from a multi-worker context without `client_index`, so "
          "they may be out of client order; this algorithm cannot run with "
          "--executor=remote until its per-client outputs carry client_index.")
    return results
  by_index = {int(np.asarray(i)): r for i, r in zip(indices, results)}
  missing = sorted(set(selected) - set(by_index))
  if missing:
    raise RuntimeError(f"{what} of clients {missing} did not come back.")
  return [by_index[i] for i in selected]


class Evaluator:
  """S and MT of a run's state over every client (module docstring).

  Args:
    algorithm: the run's `base.FederatedAlgorithm`.
    test_data: every client's `(x, y)` test arrays, in client order.
    seed: the run's seed.
    chunk: clients per call of a streamed evaluation (0: one `evaluate` call).
    cache: cache MT per client where the algorithm allows it.

  `counts` adds up, over calls, how many clients' S and MT were computed and in
  how many algorithm calls.
  """

  def __init__(self, algorithm, test_data: Sequence[Any], *, seed: int, chunk: int, cache: bool):
    self.algorithm, self.test_data = algorithm, list(test_data)
    self.seed, self.chunk = int(seed), int(chunk)
    streamed = isinstance(algorithm, base.SupportsStreamedEvaluation)
    self.streamed = self.chunk > 0 and streamed
    self.cacheable = bool(cache and streamed and algorithm.mt_cacheable)
    self.counts = dict(mt_clients=0, s_clients=0, calls=0)
    self._mt: Dict[int, Dict[str, Any]] = {}

  def trained(self, client_index: int) -> None:
    """Client `client_index` trained: its MT is recomputed at the next call."""
    self._mt.pop(client_index, None)

  def reset(self) -> None:
    """Forgets every cached MT (a resumed run recomputes each client once)."""
    self._mt = {}

  def _client_states(self, clients, indices) -> list:
    """The states of `indices` from the store; a never-trained client gets its
    initial state, rebuilt, not stored."""
    out = []
    for i in indices:
      s = clients.get(i)
      out.append(self.algorithm.initial_client_state(i) if s is None else s)
    return out

  def __call__(self, server_state, clients) -> Dict[str, Any]:
    """`aggregate_evaluation` of every client, with the clients' states in the
    store `clients` (index -> state)."""
    k = len(self.test_data)
    seeds = [base.evaluation_seed(self.seed, i) for i in range(k)]
    if not self.streamed:  # every state at once; a never-trained client's is stored
      for i in range(k):
        if i not in clients:
          clients[i] = self.algorithm.initial_client_state(i)
      states = [clients[i] for i in range(k)]
      per_client = self.algorithm.evaluate(server_state, states, seeds, self.test_data)
      self._count(k, k)
      return aggregate_evaluation(rekey(list(range(k)), per_client, "evaluation results"))
    chunks = lambda ids: [ids[j:j + self.chunk] for j in range(0, len(ids), self.chunk)]
    server_part: List[Dict[str, Any]] = []
    for ids in chunks(list(range(k))):
      out = self.algorithm.evaluate_server(server_state, ids, [seeds[i] for i in ids],
                                           [self.test_data[i] for i in ids])
      server_part.extend(plain_sums(r) for r in rekey(ids, out, "evaluation results"))
      self._count(0, len(ids))
    if not self.cacheable:
      self._mt = {}
    for ids in chunks([i for i in range(k) if i not in self._mt]):
      states = self._client_states(clients, ids)  # one chunk of states in memory at a time
      out = self.algorithm.evaluate_clients(states, ids, [seeds[i] for i in ids],
                                            [self.test_data[i] for i in ids])
      del states
      for i, r in zip(ids, rekey(ids, out, "evaluation results")):
        self._mt[i] = plain_sums(r)
      self._count(len(ids), 0)
    per_client = [{**server_part[i], **self._mt[i]} for i in range(k)]
    if not self.cacheable:
      self._mt = {}
    return aggregate_evaluation(per_client)

  def _count(self, mt_clients: int, s_clients: int) -> None:
    self.counts["calls"] += 1
    self.counts["mt_clients"] += mt_clients
    self.counts["s_clients"] += s_clients
