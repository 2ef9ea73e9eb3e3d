r"""Trains one federated algorithm and writes metrics, summary, curves, checkpoints.

    python -m launchers.train --algorithm=virtual --rounds=20 --output_dir=runs/virtual
    python -m launchers.train --algorithm=fedavg --partition=homogeneous
    python -m launchers.train --dataset=npz --data_dir=my_clients.npz

With no dataset flags it runs on scikit-learn's bundled handwritten digits (10
clients, per-class Dirichlet(0.5) partition). See README.md for every algorithm.
"""

import sys

from absl import app
from absl import flags

from tfbfl import experiment
from tfbfl import training
from tfbfl.data import DATASETS, PARTITIONS

_D = training.DEFAULTS
F = flags.FLAGS

flags.DEFINE_enum("algorithm", _D["algorithm"], training.algorithm_names(), "Federated algorithm.")
flags.DEFINE_enum("dataset", _D["dataset"], sorted(DATASETS), "Dataset (digits needs no files).")
flags.DEFINE_string("data_dir", None, "File or directory of the dataset (see data/README.md).")
flags.DEFINE_enum("partition", _D["partition"], list(PARTITIONS), "How pooled data is split over clients.")
flags.DEFINE_float("alpha", _D["alpha"], "Dirichlet concentration of the partition.")
flags.DEFINE_integer("min_size", _D["min_size"], "Minimum client size (class_dirichlet).")
flags.DEFINE_integer("classes_per_client", _D["classes_per_client"], "Classes per client (pathological).")
flags.DEFINE_integer("num_clients", _D["num_clients"], "Number of clients K.")
flags.DEFINE_integer("clients_per_round", _D["clients_per_round"], "Clients per round C (fixed).")
flags.DEFINE_integer("rounds", _D["rounds"], "Communication rounds.")
flags.DEFINE_integer("epochs_per_round", _D["epochs_per_round"], "Local epochs E per round.")
flags.DEFINE_integer("batch_size", _D["batch_size"], "Client minibatch size B.")
flags.DEFINE_float("client_lr", _D["client_lr"], "Client SGD learning rate.")
flags.DEFINE_float("max_update_ratio", _D["max_update_ratio"],
                   "Robust rounds: drop a client update that is non-finite or whose norm exceeds "
                   "this times max(norm of the server value it updates, 1) (inf: finiteness only).")
flags.DEFINE_float("server_lr", None,
                   "VIRTUAL: the damped-EP step alpha in (0, 1], taken by the server posterior "
                   "and each client factor alike (default 1/clients_per_round, measured); "
                   "other algorithms: server learning rate (default 1.0).")
flags.DEFINE_enum("architecture", _D["architecture"], list(training.ARCHITECTURES),
                  "Network: mlp (all algorithms), conv (FEMNIST net, VIRTUAL), lstm "
                  "(Shakespeare, VIRTUAL), cnn (McMahan et al. CIFAR-10 CNN, FOLA/FedCurv).")
flags.DEFINE_list("image_shape", None, "conv: image shape H,W[,C] of flat inputs (digits: 8,8).")
flags.DEFINE_list("filters", [str(f) for f in _D["filters"]], "conv: filters per conv layer.")
flags.DEFINE_list("lstm_units", [str(u) for u in _D["lstm_units"]], "lstm: units per LSTM layer.")
flags.DEFINE_list("hidden_units", [str(h) for h in _D["hidden_units"]], "Hidden layer widths.")
flags.DEFINE_integer("seed", _D["seed"], "Fixes client sampling, initialisation and data splits.")
flags.DEFINE_integer("eval_every", _D["eval_every"], "Evaluate S and MT every this many rounds.")
flags.DEFINE_integer("clients_per_group", _D["clients_per_group"], "virtual (MLP): stack this "
                     "many of a round's clients into one batched client computation (1: one by one, "
                     "the faster on CPU).")
flags.DEFINE_integer("eval_chunk", _D["eval_chunk"], "Evaluate at most this many clients per "
                     "call, MT cached per client where exact (0: every client in one call).")
flags.DEFINE_string("output_dir", None, "Where metrics.csv, summary.json, curves.png go.")
flags.DEFINE_integer("checkpoint_every", _D["checkpoint_every"], "Checkpoint every N rounds (0: never).")
flags.DEFINE_bool("resume", False, "Continue from the checkpoint in --output_dir (same flags "
                  "and data, checked).")
flags.DEFINE_bool("overwrite", _D["overwrite"], "Replace the outputs of a previous run in "
                  "--output_dir (without it, or --resume, such a directory is refused).")
flags.DEFINE_enum("executor", _D["executor"], ["local", "remote"],
                  "local: TFF worker on this machine; remote: the tfbfl-worker services in --workers.")
flags.DEFINE_list("workers", None, "--executor=remote: worker addresses host:port,host:port "
                  "(127.0.0.1 + SSH tunnels, or TLS; see BUILD.md).")
flags.DEFINE_string("tls_ca", None, "--executor=remote: PEM CA certificate that signed the workers' "
                    "certificates; turns on TLS (workers run with --tls_cert/--tls_key). See BUILD.md.")
flags.DEFINE_string("tls_cert", None, "--executor=remote: PEM client certificate of this controller, "
                    "for workers started with --tls_client_ca (with --tls_key).")
flags.DEFINE_string("tls_key", None, "--executor=remote: PEM private key of --tls_cert.")
flags.DEFINE_float("call_timeout_s", _D["call_timeout_s"],
                   "--executor=remote: deadline of each call to a worker (above the longest subround).")
flags.DEFINE_enum("client_store", _D["client_store"], ["memory", "disk"],
                  "Where the controller keeps client states: memory, or one file per client "
                  "under <output_dir>/client_states.")
# VIRTUAL
flags.DEFINE_float("precision_step", _D["precision_step"],
                   "VIRTUAL: natural-gradient step rho in [0, 1] of the shared posterior's "
                   "precisions (0: plain SGD on the softplus scales, as the paper).")
flags.DEFINE_float("kl_weight", _D["kl_weight"], "VIRTUAL: KL multiplier beta.")
flags.DEFINE_float("prior_scale", _D["prior_scale"], "VIRTUAL: std of the N(0, s^2) priors.")
flags.DEFINE_float("init_scale", _D["init_scale"], "VIRTUAL: initial posterior std.")
flags.DEFINE_bool("fedavg_init", _D["fedavg_init"], "VIRTUAL + FedAvg init variant.")
flags.DEFINE_float("server_loss_weight", _D["server_loss_weight"],
                   "VIRTUAL: weight of the server network's own cross-entropy (0 = paper eq. 3).")
flags.DEFINE_float("gate_init", _D["gate_init"], "VIRTUAL: initial lateral gate value.")
flags.DEFINE_float("prune_percentile", _D["prune_percentile"],
                   "VIRTUAL: zero Delta_i entries whose SNR is below this percentile (Sec. IV-F).")
flags.DEFINE_bool("prune_per_layer", _D["prune_per_layer"],
                  "VIRTUAL: percentile per weight tensor (else over all shared weights).")
flags.DEFINE_integer("eval_samples", _D["eval_samples"], "MC samples at evaluation (0: posterior mean).")
# FedProx
flags.DEFINE_float("mu", _D["mu"], "FedProx proximal strength.")
# FOLA, offline Laplace, FedCurv
flags.DEFINE_float("fola_lambda", _D["fola_lambda"], "FOLA: strength lambda of the prior penalty.")
flags.DEFINE_float("fola_gamma", _D["fola_gamma"], "FOLA: variance of the round-1 prior N(0, gamma I) (inf: flat).")
flags.DEFINE_float("fola_eps", _D["fola_eps"], "FOLA: server epsilon for zero aggregate precision.")
flags.DEFINE_float("fola_clip_norm", _D["fola_clip_norm"], "FOLA/FedCurv: client gradient clip norm (0: none).")
flags.DEFINE_float("compress_p", _D["compress_p"], "FOLA: fraction of precisions kept per layer (1: none).")
flags.DEFINE_float("fedcurv_lambda", _D["fedcurv_lambda"], "FedCurv: penalty strength lambda.")


def params_from_flags() -> dict:
  return {name: F[name].value for name in training.DEFAULTS if name in F and name != "verbose"}


def fail(message: str) -> None:
  """Exits with status 1 after one line on stderr (absl's UsageError would
  print the whole module help first)."""
  print(f"FATAL train: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
  sys.exit(1)


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {argv[1:]}")
  try:
    summary = training.run_training(params_from_flags())
  except (ValueError, FileNotFoundError) as e:
    fail(str(e))
  except experiment.NonFiniteServerStateError as e:  # robust rounds: one line, no traceback
    fail(str(e))
  print(f"{summary['algorithm']}: best S accuracy {summary['best_server_accuracy']:.4f}, "
        f"best MT accuracy {summary['best_mt_accuracy']:.4f}, "
        f"final S {summary['final_server_accuracy']:.4f}, final MT {summary['final_mt_accuracy']:.4f} "
        f"({summary['rounds']} rounds, {summary['wall_time_s']:.1f} s)")


if __name__ == "__main__":
  app.run(main)
