r"""Writes a run's deployable models (TF SavedModels) from its last checkpoint.

    python -m launchers.export --output_dir=runs/virtual
    python -m launchers.export --output_dir=runs/virtual --export_samples=20

A run with `--output_dir` writes `<output_dir>/export/` when it ends; this launcher
writes the same files for a run that stopped earlier (or again, e.g. with another
`--export_samples`), from `<output_dir>/checkpoint.npz` (written by
`--checkpoint_every=N`; a `tfbfl.state_files` file, never a pickle): the data and the
algorithm are rebuilt from the flags the checkpoint records (the data must be
unchanged: fingerprint), then `tfbfl.export.export_run` writes

    <export_dir>/server/              the model metric S evaluates
    <export_dir>/clients/<client_id>/ each client's model, the one MT evaluates
    <export_dir>/export.json          manifest: signature, paths, which models

Serving (any TensorFlow, no tfbfl): `tf.saved_model.load(path)
.signatures["serving_default"](x=...)` -> {"probabilities", "predictions"}; see
`tfbfl/export.py` and docs/library.md. A run directory in use by a run is refused.
"""

from absl import app
from absl import flags

from tfbfl import flags as tfbfl_flags

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None,
                                  "The run's --output_dir (holds checkpoint.npz).")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None,
                                  "Where to write (default: <output_dir>/export, as the run).")
_EXPORT_SAMPLES = flags.DEFINE_integer(
    "export_samples", None, "Server model as an N-sample Monte Carlo predictive where the "
    "algorithm is Bayesian (VIRTUAL); 0: what metric S evaluates; default: the run's "
    "--export_samples (0 if it recorded none).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _OUTPUT_DIR.value:
    raise ValueError("--output_dir is required (the run directory holding checkpoint.npz).")
  if _EXPORT_SAMPLES.value is not None and _EXPORT_SAMPLES.value < 0:
    raise ValueError(f"--export_samples must be >= 0, got {_EXPORT_SAMPLES.value}.")
  from tfbfl import restore  # pylint: disable=g-import-not-at-top

  manifest = restore.export_from_checkpoint(_OUTPUT_DIR.value,
                                           export_dir=_EXPORT_DIR.value,
                                           samples=_EXPORT_SAMPLES.value,
                                           verbose=True)
  print(f"{manifest['algorithm']}: server model and {len(manifest['clients'])} client models "
        f"(round {manifest['run'].get('round')}), signature serving_default(x: "
        f"{manifest['signature']['inputs']['x']['dtype']} "
        f"{manifest['signature']['inputs']['x']['shape']})")


if __name__ == "__main__":
  tfbfl_flags.run(main, "export")
