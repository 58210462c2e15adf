"""The house by layer: decodelab's packages follow the data flow, and each imports only from the
layers below it (or its own); and no public function takes more than 8 parameters (the rarer
ones come grouped in a small frozen dataclass, such as ``decode.DecodeOptions``).

The import graph is read from the source with ``ast``; nothing is imported. Every import counts,
the ones inside functions and under ``TYPE_CHECKING`` too: a lazy import is still a dependency.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "decodelab"

# The layer order, written once: text -> ids -> model (with its cache) -> logits -> sampling ->
# tokens -> decode loops -> serving -> measurements -> rows -> pages. A module may import from its
# own layer and the ones below, never from above. The top-level ``decodelab/__init__.py`` (the
# public names) sits above them all.
LAYERS = {
    "config": 0, "checks": 0, "optional": 0,
    "text": 1, "cache": 1, "sampling": 1, "sharding": 1,
    "model": 2, "decode": 2,
    "speculative": 3, "serving": 3, "compress": 3,
    "measure": 4, "convert": 4,
    "train": 5,
    "report": 6,
    "experiment": 7,
}
TOP = max(LAYERS.values()) + 1
MAX_LINES = 400
# Parameters of a public function or method, self and cls aside, positional and keyword-only.
MAX_PARAMETERS = 8


def modules_of(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of ``package`` (a folder named decodelab)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules_of(PACKAGE)


def layer(module: str) -> int:
    parts = module.split(".")
    return TOP if len(parts) == 1 else LAYERS[parts[1]]


def imports(module: str, modules=MODULES) -> list[tuple[str, str, int]]:
    """``(imported module, name taken or "", line)`` for each decodelab import of ``module``; a
    ``from pkg import sub`` that names a module counts as an import of that module."""
    path = modules[module]
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names
                      if a.name.split(".")[0] == "decodelab"]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = ".".join(base[:len(base) - node.level + 1] + ([target] if target else []))
            if target.split(".")[0] != "decodelab":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in modules
                             else (target, alias.name, node.lineno))
    return found


def edges(modules=MODULES) -> dict[str, set[str]]:
    """Module -> the modules it imports; a package's ``__init__`` re-exporting its own modules is
    not a dependency of it."""
    graph = {}
    for module in modules:
        graph[module] = {target for target, _, _ in imports(module, modules)
                         if target != module and not target.startswith(module + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start); on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop(); on_stack.discard(member); component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child); on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def parameter_counts(source: str) -> list[tuple[int, str, int]]:
    """``(line, name, parameters)`` of every public function and method of a module (a name not
    starting with ``_``, and ``__init__``); functions nested in functions are not counted. Every
    positional and keyword-only parameter counts, a method's ``self`` or ``cls`` aside."""
    found = []

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not child.name.startswith("_") or child.name == "__init__":
                    args = child.args
                    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                    if in_class and names[:1] in (["self"], ["cls"]):
                        names = names[1:]
                    found.append((child.lineno, child.name, len(names)))
            elif isinstance(child, ast.ClassDef):
                visit(child, True)
            else:  # module- or class-level blocks (if, try) hold definitions too
                visit(child, in_class)

    visit(ast.parse(source), False)
    return found


def test_every_package_has_a_layer():
    assert sorted({m.split(".")[1] for m in MODULES if "." in m} - set(LAYERS)) == []


def test_the_import_graph_has_no_circle():
    assert circles(edges()) == []


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)}), "
              f"line {line}"
              for module in MODULES for target, _, line in imports(module)
              if target in MODULES and layer(target) > layer(module)]
    assert upward == []


def test_no_module_imports_another_modules_underscore_names():
    private = [f"{module} takes {name} from {target}, line {line}"
               for module in MODULES for target, name, line in imports(module)
               if name.startswith("_") and not name.startswith("__") and target != module]
    assert private == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_is_over_400_lines(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_the_checks_see_a_circle_an_upward_import_and_an_underscore_name(tmp_path):
    package = tmp_path / "decodelab"
    for name, source in {
        "__init__.py": "",
        "text/__init__.py": "",
        "text/a.py": "from decodelab.text.b import x\nfrom decodelab.train import t\n",
        "text/b.py": "def f():\n    from decodelab.text import a\n",
        "train/__init__.py": "",
        "train/t.py": "from decodelab.text import _hidden\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    modules = modules_of(package)
    assert circles(edges(modules)) == [["decodelab.text.a", "decodelab.text.b"]]
    assert [(target, line) for target, _, line in imports("decodelab.text.a", modules)
            if layer(target) > layer("decodelab.text.a")] == [("decodelab.train.t", 2)]
    assert imports("decodelab.train.t", modules) == [("decodelab.text", "_hidden", 1)]


def test_no_public_function_takes_more_than_8_parameters():
    wide = [f"{path.relative_to(ROOT)}:{line} {name} {count}"
            for folder in (PACKAGE, ROOT / "experiments") for path in sorted(folder.rglob("*.py"))
            for line, name, count in parameter_counts(path.read_text(encoding="utf-8"))
            if count > MAX_PARAMETERS]
    assert wide == []


def test_the_parameter_count_sees_methods_and_keyword_only_parameters_but_not_nested_functions():
    source = ("def public(a, b, *args, c, d=1, **kwargs):\n"
              "    def nested(a, b, c, d, e, f, g, h, i): pass\n"
              "def _private(a, b, c, d, e, f, g, h, i): pass\n"
              "class Engine:\n"
              "    def __init__(self, a, /, b, *, c): pass\n"
              "    @classmethod\n"
              "    def make(cls, a): pass\n"
              "    def _helper(self, a, b, c, d, e, f, g, h, i): pass\n"
              "if True:\n"
              "    def guarded(a): pass\n")
    assert parameter_counts(source) == [(1, "public", 4), (5, "__init__", 3), (7, "make", 1),
                                        (10, "guarded", 1)]


def test_no_package_exports_a_name_that_hides_one_of_its_modules():
    """``from decodelab.pkg import mod`` must give the module: a package re-exporting a function
    named like one of its modules (``measure.perplexity``) would hand out the function."""
    hidden = []
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for target, name, line in imports(module):
            if name and f"{module}.{name}" in MODULES:
                hidden.append(f"{module} exports {name} from {target}, line {line}")
    assert hidden == []


# The names `import decodelab as dl` exported before the packages by layer: each still resolves.
PUBLIC = ("BeamSearchOutput", "GenerateOutput", "KVCache", "Kivi", "KiviKVCache", "ModelConfig",
          "NgramDrafter", "PretrainedTokenizer", "QuantizedKVCache", "SamplingParams", "Scoreboard",
          "SpeculativeOutput", "Tokenizer", "TrainConfig", "Transformer", "beam_search", "compare",
          "generate", "init_cache", "load_checkpoint", "load_gguf", "load_hf", "make_mesh",
          "param_count", "parameter_bytes", "prune", "prune_heads", "prune_neurons", "quantize",
          "save_checkpoint", "set_memory_limit", "shard", "speculative_generate")


def test_the_public_names_are_all_still_exported():
    import decodelab as dl

    assert [name for name in PUBLIC if name not in dl.__all__ or not hasattr(dl, name)] == []
