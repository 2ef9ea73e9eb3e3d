"""Every `tf.function` of the package is built without autograph.

Autograph transpiles each Python function a converted function calls, tfbfl's
Gaussian algebra, layers and networks included, though none of them needs it: the
package's loops over tensors are explicit `tf.while_loop`s (`client_batch.train_loop`,
the Monte Carlo predictive, FOLA's offline Fisher). A `tf.function` added without
`autograph=False` brings that start-up cost back (measured in docs/performance.md,
"Start-up"), so the source is checked here; the loops themselves are checked by every
test that trains or evaluates.
"""

import ast
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _is_tf_function(node):
  return (isinstance(node, ast.Attribute) and node.attr == "function" and
          isinstance(node.value, ast.Name) and node.value.id == "tf")


def _tf_functions_with_autograph(path):
  """Line numbers of `tf.function` uses in `path` that do not pass `autograph=False`."""
  bad = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    decorators = getattr(node, "decorator_list", [])
    bad += [d.lineno for d in decorators if _is_tf_function(d)]  # bare @tf.function
    if isinstance(node, ast.Call) and _is_tf_function(node.func):
      off = [k for k in node.keywords
             if k.arg == "autograph" and isinstance(k.value, ast.Constant) and k.value.value is False]
      if not off:
        bad.append(node.lineno)
  return bad


def test_the_check_sees_both_forms(tmp_path):
  source = tmp_path / "m.py"
  source.write_text("import tensorflow as tf\n"
                    "@tf.function\ndef a(): pass\n"
                    "@tf.function(jit_compile=True)\ndef b(): pass\n"
                    "c = tf.function(a, autograph=False)\n"
                    "d = tf.function(a)\n")
  assert _tf_functions_with_autograph(source) == [2, 4, 7]


def test_every_tf_function_of_the_package_turns_autograph_off():
  bad = {str(p.relative_to(_ROOT)): lines for p in sorted((_ROOT / "tfbfl").rglob("*.py"))
         if (lines := _tf_functions_with_autograph(p))}
  assert not bad, f"tf.function without autograph=False (file: lines): {bad}"
