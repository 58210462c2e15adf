"""The package's shape: modules use each other's public names only, files stay short, and a
concept shared by several modules is defined in one place."""

import ast
import collections
import pathlib

import pytest

import decodelab

PACKAGE = pathlib.Path(decodelab.__file__).parent
FILES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 500


def is_module(dotted: str) -> bool:
    """``decodelab.a.b`` names a module or package of this package."""
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: pathlib.Path) -> list[str]:
    """``from decodelab.x import _y`` and ``x._y`` (x bound to a decodelab module) in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: dict[str, str] = {}  # local name -> dotted module name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "decodelab":
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else "decodelab"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("decodelab"):
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                elif is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return modules.get(node.id)
        if isinstance(node, ast.Attribute):
            parent = module_of(node.value)
            if parent and is_module(f"{parent}.{node.attr}"):
                return f"{parent}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = module_of(node.value)
            if owner:
                found.append(f"line {node.lineno}: {owner}.{node.attr}")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_uses_another_modules_private_names(path):
    assert private_uses(path) == []


PROGRAMS_AND_TESTS = sorted([*(PACKAGE.parent / "tests").rglob("*.py"),
                            *(PACKAGE.parent / "experiments").rglob("*.py")])


@pytest.mark.parametrize("path", PROGRAMS_AND_TESTS,
                         ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_test_or_program_uses_the_librarys_private_names(path):
    """Tests and study programs use what the library makes public, like any user."""
    assert private_uses(path) == []


def test_the_private_name_check_sees_both_forms(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("from decodelab.decode.generation import _body\nfrom decodelab import sampling\n"
                      "import decodelab as dl\nx = sampling._STORAGE\n"
                      "y = dl.sampling.processors._probs\n")
    assert private_uses(source) == ["line 1: from decodelab.decode.generation import _body",
                                    "line 4: decodelab.sampling._STORAGE",
                                    "line 5: decodelab.sampling.processors._probs"]


def test_no_file_is_longer_than_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in FILES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def top_level_names(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
    return names


# Concepts several modules share: each is defined in exactly one module.
SHARED = ("Request", "BatchRequest", "GenerateOutput", "FINISH_REASONS", "RUNNING", "EOS", "STOP",
          "LENGTH", "PAD_TOKEN", "bucket_length", "check_int", "check_size", "is_int",
          "check_model", "position_limit", "CompiledLoop")


def test_each_shared_concept_is_defined_once():
    where = collections.defaultdict(list)
    for path in FILES:
        for name in top_level_names(path):
            where[name].append(str(path.relative_to(PACKAGE)))
    assert {name: where[name] for name in SHARED if len(where[name]) != 1} == {}
    assert {name: where[name] for name in ("_check_int", "_is_int", "_is_token_id")
            if where[name]} == {}
