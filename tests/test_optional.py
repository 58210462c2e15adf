"""Optional dependencies: with any of them missing (hidden by an import finder), the feature that
needs it fails with an error naming the package, the feature and the extra that installs it."""

import ast
import importlib.abc
import pathlib
import sys

import numpy as np
import pytest
import requires

import decodelab as dl
from decodelab import optional
from decodelab.convert import PretrainedTokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]


class Hide(importlib.abc.MetaPathFinder):
    """An import finder that answers "not installed" for one package and its submodules."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] == self.package:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.fixture
def hide(monkeypatch):
    """``hide(package)``: make ``package`` look uninstalled until the test ends."""

    def hide_package(package: str) -> None:
        monkeypatch.setattr(sys, "meta_path", [Hide(package), *sys.meta_path])
        for name in list(sys.modules):
            if name.partition(".")[0] == package:
                monkeypatch.delitem(sys.modules, name)

    return hide_package


@pytest.mark.parametrize("module, extra, distribution", [
    ("gguf", "real", "gguf"),
    ("gguf.quants", "real", "gguf"),
    ("tokenizers", "real", "tokenizers"),
    ("jinja2.sandbox", "real", "jinja2"),
    ("safetensors", "real", "safetensors"),
    ("torch", "peer", "torch"),
    ("transformers", "peer", "transformers"),
    ("llama_cpp", "llamacpp", "llama-cpp-python"),
    ("qwix", "quant", "qwix"),
    ("outlines_core", "structured", "outlines-core"),
])
def test_every_missing_optional_package_names_its_extra(hide, module, extra, distribution):
    hide(module.partition(".")[0])
    with pytest.raises(optional.MissingExtra) as caught:
        optional.require(module)
    message = str(caught.value)
    assert f"needs the optional package '{distribution}', which is not installed: " in message
    assert f"pip install -e '.[{extra}]' (or pip install {distribution})" in message
    assert isinstance(caught.value, ImportError)  # `except ImportError` still catches it


def test_a_constraint_without_outlines_core_says_to_install_the_structured_extra(hide):
    from decodelab.sampling import automaton

    tokenizer = dl.Tokenizer.train([REPO / "README.md"], vocab_size=400)
    hide("outlines_core")
    with pytest.raises(optional.MissingExtra, match=r"compiling a regex or JSON-schema constraint "
                                                    r".*pip install -e '\.\[structured\]'"):
        automaton.table([("regex", "[0-9]+")], tokenizer, 400, tokenizer.eos_id)
    assert automaton.table([None], tokenizer, 400, tokenizer.eos_id)[0].num_states == 1


def test_load_gguf_without_gguf_says_to_install_the_real_extra(hide, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    hide("gguf")
    with pytest.raises(optional.MissingExtra, match=r"reading GGUF files \(load_gguf, "
                                                    r"gguf_tokenizer\) needs the optional package "
                                                    r"'gguf'.*pip install -e '\.\[real\]'"):
        dl.load_gguf(path)


def test_a_pretrained_tokenizer_without_tokenizers_says_to_install_the_real_extra(hide):
    hide("tokenizers")
    with pytest.raises(optional.MissingExtra, match=r"needs the optional package 'tokenizers'.*"
                                                    r"pip install -e '\.\[real\]'"):
        PretrainedTokenizer.from_json("{}")


def test_the_benchmark_peer_without_torch_is_left_out(hide):
    from decodelab.measure import peers

    hide("torch")
    assert peers.time_hf_generate(None, np.zeros((1, 4), np.int32), 2, 1) == {}


def test_require_refuses_a_package_that_is_not_optional():
    with pytest.raises(ValueError, match=r"module must be an optional package of \[.*\] \(or one "
                                         r"of their submodules\), got 'numpy'"):
        optional.require("numpy")


def test_no_module_imports_an_optional_package_but_through_require():
    for folder in ("decodelab", "experiments"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                direct = [n for n in names if n.partition(".")[0] in optional.OPTIONAL]
                assert not direct, f"{path.relative_to(REPO)}:{node.lineno} imports {direct}"


def test_a_missing_test_dependency_skips_outside_ci_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the test needs it"):
        requires.importorskip("no_such_module_here", reason="the test needs it")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no_such_module_here is missing although CI "
                                                    r"is set .*pip install -e '\.\[test\]'"):
        requires.importorskip("no_such_module_here", reason="the test needs it")
