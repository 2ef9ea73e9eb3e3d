"""The packages' import graph, drawn from every import statement (function-local
ones included) and every deferred `_lazy.load("tfbfl...")`: no module imports itself
back through others, and dependencies point down (algorithms never import the driver,
the runner or the run exporter; the library `tfbfl` never imports the paper campaign
`reproduction`, which is an application of it)."""

import ast
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[1]


_PACKAGES = ("tfbfl", "reproduction")


def _modules():
  out = {}
  for path in (p for package in _PACKAGES for p in (_ROOT / package).rglob("*.py")):
    parts = list(path.relative_to(_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _graph():
  """module -> the tfbfl modules it imports (a package's `from pkg import sub` is
  an edge to `pkg.sub`; a submodule's implicit import of its own package is not)."""
  modules = _modules()

  def resolve(name):
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph = {}
  for name, path in modules.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([node.module] if node.module else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                   for a in node.names]
      elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
            node.func.attr == "load" and node.args and isinstance(node.args[0], ast.Constant) and
            str(node.args[0].value).startswith(tuple(f"{p}." for p in _PACKAGES))):
        targets = [node.args[0].value]  # `tfbfl._lazy.load("tfbfl.x")`: an import on first use
      else:
        continue
      for target in targets:
        if target.split(".")[0] in _PACKAGES:
          dep = resolve(target)
          if dep and dep != name:
            deps.add(dep)
    graph[name] = deps
  return graph


def _cycles(graph):
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


@pytest.fixture(scope="module")
def graph():
  """The graph, drawn once for the module (parsing every file of both packages is
  most of each test's time; no test changes it: the planted ones are copies)."""
  return _graph()


def test_the_graph_is_drawn_from_every_import(graph):
  assert "tfbfl.predictor" in graph["tfbfl.algorithms.fedavg"]
  assert "tfbfl.export" in graph["tfbfl.restore"]
  # A circle planted in a copy of the graph is found (the check can fail).
  planted = dict(graph, **{"tfbfl.predictor": graph["tfbfl.predictor"] | {"tfbfl.restore"}})
  assert any("tfbfl.predictor" in c and "tfbfl.restore" in c for c in _cycles(planted))


def test_no_import_circle(graph):
  assert _cycles(graph) == []


_ABOVE_THE_ALGORITHMS = ("tfbfl.driver", "tfbfl.round_loop", "tfbfl.export", "tfbfl.restore",
                         "tfbfl.checkpoint", "reproduction")


def test_the_library_never_imports_the_campaign(graph):
  assert any(m.startswith("reproduction") for m in graph)  # the campaign is in the graph
  bad = sorted((m, d) for m, deps in graph.items() if m.split(".")[0] == "tfbfl"
               for d in deps if d.split(".")[0] == "reproduction")
  assert not bad, bad
  # An arrow planted from the library to the campaign is found (the check can fail).
  planted = dict(graph, **{"tfbfl.driver": graph["tfbfl.driver"] | {"reproduction.runner"}})
  assert any(m == "tfbfl.driver" for m, deps in planted.items() if m.startswith("tfbfl")
             for d in deps if d.startswith("reproduction"))


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith("tfbfl.algorithms")))
def test_algorithms_import_nothing_above_them(graph, module):
  bad = sorted(d for d in graph[module]
               if any(d == a or d.startswith(a + ".") for a in _ABOVE_THE_ALGORITHMS))
  assert not bad, (module, bad)
