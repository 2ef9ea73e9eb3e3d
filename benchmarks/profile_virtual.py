r"""Where one VIRTUAL client update spends its time: a per-op profile, by category.

    python -m benchmarks.profile_virtual                  # digits and MNIST (if present)
    python -m benchmarks.profile_virtual --dataset=mnist --epochs=2

One client's `virtual.client_update` (the lean step: `fused`, and the reference
`sgd_step` path it replaced) is built as a graph and run in a TensorFlow session on
one thread (`intra_op` = `inter_op` = 1: inside TFF's worker the clients of a round
train concurrently, one per core), once to warm up, once timed, once with a full
trace (`RunOptions.FULL_TRACE`, the per-node step stats of every op executed,
including those inside the loop body's step function). The ops' times are summed
by category:

  matmul              MatMul / oneDNN matmuls (forward, backward);
  per-parameter math  elementwise ops whose output is parameter-sized (larger than
                      any activation): softplus, variances, KL gradient, updates;
  per-parameter copy  concat / split / slice / gather of parameter-sized tensors;
  random draws        the stateless normals of local reparameterization and their
                      seeds;
  activations, loss   the remaining math on activation-sized tensors;
  loop, control, data loop and function-call machinery, constants, the minibatch
                      gather.

Five traced runs; each op's time is its median over them (on a shared machine a
thread descheduled inside an op inflates that op in one run). Per step, in ms, with
the fastest untraced wall time per step beside (tracing adds ~1 us an op); the
busiest op types follow.
"""

import collections
import dataclasses
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tfbfl.algorithms import virtual
from tfbfl.algorithms.virtual import step as virtual_step

CATEGORIES = ("matmul", "per-parameter math", "per-parameter copy", "random draws",
              "activations, loss", "loop, control, data")
_LOOP_OPS = {
    "Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond", "Less", "Identity", "Const",
    "_Arg", "_Retval", "PartitionedCall", "StatefulPartitionedCall", "NoOp", "_SOURCE",
    "RefEnter", "Shape", "Cast", "Range", "Fill", "ZerosLike", "OnesLike", "Size", "Rank",
    "BroadcastArgs", "BroadcastGradientArgs", "GatherV2", "ResourceGather", "ExpandDims",
    "Squeeze", "Reshape", "StridedSlice", "Pack", "Unpack", "Maximum", "Minimum", "AddV2"
}
_COPY_OPS = {"ConcatV2", "Concat", "SplitV", "Split", "Slice", "StridedSlice", "GatherV2", "Pack",
             "Tile", "Pad", "StridedSliceGrad", "SliceGrad", "BroadcastTo"}


def _op_type(node):
  label = node.timeline_label
  if " = " in label:
    return label.split(" = ")[1].split("(")[0]
  return node.node_name.split("/")[-1].split(":")[0]


def _numel(node):
  best = 0
  for out in node.output:
    dims = [d.size for d in out.tensor_description.shape.dim]
    if dims and all(d >= 0 for d in dims):
      best = max(best, int(np.prod(dims)))
  return best


def category(op, numel, big):
  """The category of an op of type `op` whose largest output has `numel` entries;
  `big`: the entries above which a tensor is parameter-sized."""
  if "MatMul" in op or op.startswith("_MklNativeFusedMatMul") or op.startswith("_MklMatMul"):
    return "matmul"
  if op.startswith("StatelessRandom") or op.startswith("StatelessTruncated"):
    return "random draws"
  if numel > big:
    return "per-parameter copy" if op in _COPY_OPS else "per-parameter math"
  if op in _LOOP_OPS or op.startswith("_"):
    return "loop, control, data"
  return "activations, loss"


def profile_client(cfg, x, y, epochs=2, fused=True, repeats=5):
  """`(wall s per step, {category: s per step}, {op type: s per step}, steps)` of one
  client's update (single-threaded session; see the module docstring)."""
  cfg = dataclasses.replace(cfg, epochs=epochs)
  post = tf.nest.map_structure(np.asarray, virtual.initial_posterior(cfg))
  state = tf.nest.map_structure(np.asarray, virtual.initial_client_state(cfg, 0, post))
  orig = virtual_step.train_clients
  graph = tf.Graph()
  try:
    virtual_step.train_clients = lambda *a, **k: orig(*a, fused=fused, **k)
    with graph.as_default():
      net = virtual.build_networks(cfg)
      out = virtual.client_update(cfg, post, state, tf.constant([0, 1], tf.int64),
                                  tf.constant(x, tf.float32), tf.constant(y), net=net)
      init = tf.compat.v1.global_variables_initializer()
  finally:
    virtual_step.train_clients = orig
  steps = epochs * -(-len(y) // cfg.batch_size)
  big = 2 * cfg.batch_size * max([cfg.input_dim] + list(cfg.hidden_units))
  kinds = {}
  config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                    inter_op_parallelism_threads=1)
  with tf.compat.v1.Session(graph=graph, config=config) as sess:
    sess.run(init)
    sess.run(out)
    walls, runs = [], []
    for _ in range(repeats):
      t = time.perf_counter()
      sess.run(out)
      walls.append((time.perf_counter() - t) / steps)
      meta = tf.compat.v1.RunMetadata()
      sess.run(out,
               options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
               run_metadata=meta)
      nodes = collections.Counter()
      for dev in meta.step_stats.dev_stats:
        for node in dev.node_stats:
          nodes[node.node_name] += node.all_end_rel_micros * 1e-6 / steps
          kinds[node.node_name] = (_op_type(node), _numel(node))
      runs.append(nodes)
  # Per node the median over the runs: the machine is shared, and a thread
  # descheduled inside an op inflates that op in one run only.
  wall = float(np.min(walls))
  by_cat, by_op = collections.Counter(), collections.Counter()
  for name, (op, numel) in kinds.items():
    sec = float(np.median([r.get(name, 0.0) for r in runs]))
    by_cat[category(op, numel, big)] += sec
    by_op[op] += sec
  return wall, by_cat, by_op, steps


def print_profile(cfg, x, y, epochs=2, top=12):
  """Prints the fused and the reference step's profiles side by side."""
  results = {f: profile_client(cfg, x, y, epochs, fused=f) for f in (True, False)}
  steps = results[True][3]
  print(f"per-op profile of one VIRTUAL client update ({len(y)} examples x {epochs} epochs = "
        f"{steps} steps of batch {cfg.batch_size}; one thread; ms a step):")
  print(f"  {'':22s} {'fused step':>16s} {'reference step':>16s}")
  for cat in CATEGORIES:
    row = [results[f][1].get(cat, 0.0) for f in (True, False)]
    share = [r / max(sum(results[f][1].values()), 1e-12) for r, f in zip(row, (True, False))]
    print(f"  {cat:22s} {row[0] * 1e3:7.3f} ({share[0]:4.0%})  {row[1] * 1e3:7.3f} "
          f"({share[1]:4.0%})")
  totals = [sum(results[f][1].values()) for f in (True, False)]
  print(f"  {'sum of op times':22s} {totals[0] * 1e3:7.3f}         {totals[1] * 1e3:7.3f}")
  print(f"  {'wall, untraced (min)':22s} {results[True][0] * 1e3:7.3f}         "
        f"{results[False][0] * 1e3:7.3f}   (reference / fused = "
        f"{results[False][0] / results[True][0]:.2f})")
  print("  busiest op types of the fused step (ms a step): " + ", ".join(
      f"{op} {sec * 1e3:.3f}" for op, sec in results[True][2].most_common(top)))
  return results


def main(argv):
  del argv
  from benchmarks import protocols  # pylint: disable=g-import-not-at-top
  from tfbfl import driver  # pylint: disable=g-import-not-at-top
  from tfbfl.algorithms import registry  # pylint: disable=g-import-not-at-top
  for name in flags.FLAGS.dataset:
    why = protocols.mnist_missing(flags.FLAGS.data_dir) if name == "mnist" else None
    if why:
      print(why)
      continue
    params = driver.resolve_params(
        protocols.dataset_params(name, flags.FLAGS.data_dir, flags.FLAGS.epochs))
    fd = driver.load_data(params)
    cfg = registry.get("virtual").make_config(params, fd)
    x, y = fd.train[fd.client_ids[0]]
    print(f"== {name}")
    print_profile(cfg, np.reshape(x, [len(y), -1]), y, epochs=flags.FLAGS.epochs)


if __name__ == "__main__":
  from benchmarks import protocols as _protocols  # pylint: disable=g-import-not-at-top
  flags.DEFINE_list("dataset", ["digits", "mnist"], "digits and/or mnist.")
  flags.DEFINE_string("data_dir", _protocols.DEFAULT_MNIST_DIR, "MNIST idx files (.gz).")
  flags.DEFINE_integer("epochs", 2, "Epochs of the profiled update.")
  app.run(main)
