"""Pipeline: a tokenizer and a model are trained once per configuration and reused after, an
interrupted model continues from its checkpoint, and keys follow every config that matters."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab

from decodelab.convert import PretrainedTokenizer
from decodelab.experiment import artefacts as pipeline
from decodelab.experiment import presets
from decodelab.text.tokenizer import Tokenizer
from decodelab.train import checkpoint
from decodelab.train import trainer as train
from decodelab.train.options import RunOptions

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = dict(vocab_size=512, model_type="bpe")
TRAIN = dict(steps=4, batch_size=4, seq_len=32, warmup_steps=1, checkpoint_every=2, log_every=1)


def model_section(**changes):
    section = presets.model_section("tiny")
    section.update(dict(max_seq_len=64, **changes))
    return section


def params_of(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="module")
def first(workdir):
    return pipeline.load_or_train(TOKENIZER, model_section(), TRAIN, workdir, progress=False)


@pytest.mark.slow
def test_the_first_call_trains_into_the_documented_layout(first, workdir):
    assert first.resumed_from is None and first.step == 4
    assert [h["step"] for h in first.history] == [1, 2, 3, 4]
    key = pipeline.tokenizer_key(TOKENIZER)
    assert (workdir / "tokenizers" / key / "tokenizer.model").is_file()
    assert first.directory.parent == workdir / "models"
    spec = json.loads((first.directory / "spec.json").read_text())
    assert spec["train"] == train.TrainConfig(**TRAIN).to_dict()
    assert spec["model"]["vocab_size"] == 512 and spec["tokenizer"] == TOKENIZER


@pytest.mark.slow
def test_a_finished_model_is_reused_not_retrained(first, workdir, monkeypatch):
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("retrained"))
    monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: pytest.fail("tokenizer retrained"))
    again = pipeline.load_or_train(TOKENIZER, model_section(), TRAIN, workdir, progress=False)
    assert again.resumed_from == 4 and again.step == 4 and again.history == first.history
    assert again.directory == first.directory
    assert again.tokenizer.serialized_model() == first.tokenizer.serialized_model()
    for a, b in zip(params_of(first.model), params_of(again.model), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_trained_model_returns_the_model_and_its_tokenizer(first, workdir):
    model, tokenizer = pipeline.trained_model(TOKENIZER, model_section(), TRAIN, workdir,
                                              progress=False)
    assert model.config == first.model.config and tokenizer.vocab_size == 512


@pytest.mark.slow
def test_an_interrupted_model_continues_from_its_checkpoint(first, workdir):
    tc = train.TrainConfig(**dict(TRAIN, steps=6))
    model_cfg = first.model.config
    directory = workdir / "models" / pipeline.model_key(TOKENIZER, model_cfg, tc)
    stream = np.arange(2000, dtype=np.int32) % 512  # any data: the pipeline only sees checkpoints
    train.train(model_cfg, tc, stream, run=RunOptions(
        tokenizer=first.tokenizer, checkpoint_dir=directory / "checkpoints", stop_after=2,
        progress=False))
    resumed = pipeline.load_or_train(TOKENIZER, model_section(), tc, workdir, progress=False)
    assert resumed.directory == directory
    assert resumed.resumed_from == 2 and resumed.step == 6
    assert [h["step"] for h in resumed.history] == [3, 4, 5, 6]


@pytest.mark.slow
def test_resume_false_refuses_existing_checkpoints(first, workdir):
    with pytest.raises(ValueError, match=r"holds checkpoints of this model \(step 4 of 4\)"):
        pipeline.load_or_train(TOKENIZER, model_section(), TRAIN, workdir, resume=False,
                               progress=False)


@pytest.mark.slow
def test_keys_follow_every_config_that_matters(first):
    cfg, tc = first.model.config, train.TrainConfig(**TRAIN)
    key = pipeline.model_key(TOKENIZER, cfg, tc)
    assert key == pipeline.model_key(dict(TOKENIZER), cfg, train.TrainConfig(**TRAIN))
    assert key != pipeline.model_key(TOKENIZER, cfg.replace(position="alibi"), tc)
    assert key != pipeline.model_key(TOKENIZER, cfg, dataclasses.replace(tc, seed=1))
    assert key != pipeline.model_key(dict(TOKENIZER, model_type="unigram"), cfg, tc)
    assert pipeline.tokenizer_key(TOKENIZER) != pipeline.tokenizer_key(dict(vocab_size=600))


@pytest.mark.slow
def test_a_diverging_model_is_caught_at_its_step_and_nothing_is_cached(first, workdir,
                                                                        monkeypatch):
    monkeypatch.setattr(train.NextToken, "loss", lambda self, model, windows, aux: jnp.nan)
    tc = dict(TRAIN, seed=7)  # a model of its own
    with pytest.raises(train.TrainingDiverged, match="not finite at step 1 "):
        pipeline.load_or_train(TOKENIZER, model_section(), tc, workdir, progress=False)
    directory = workdir / "models" / pipeline.model_key(TOKENIZER, first.model.config,
                                                       train.TrainConfig(**tc))
    assert checkpoint.open_manager(directory / "checkpoints", read_only=True).all_steps() == []
    assert not (directory / "history.json").exists()


@pytest.mark.parametrize("tokenizer_cfg, message", [
    (dict(vocab_size=512, vocab=3), r"tokenizer_cfg fields must be arguments of Tokenizer.train "
                                    r".*got unknown \['vocab'\]"),
    (dict(model_type="bpe"), "tokenizer_cfg must set vocab_size"),
    ("bpe", "tokenizer_cfg must be a ConfigDict section or a dict, got str"),
])
def test_bad_tokenizer_configs_are_refused_by_name(tokenizer_cfg, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        pipeline.trained_tokenizer(tokenizer_cfg, tmp_path)


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="workdir must be a directory, got a file"):
        pipeline.trained_tokenizer(TOKENIZER, tmp_path / "file")


@pytest.mark.slow
def test_the_train_program_shares_the_cache_and_keeps_its_resume_flag(first, workdir):
    # The same configs as `first`, through configs/train.py: the program finds that model.
    command = [sys.executable, "-m", "experiments.train", "--config=configs/train.py:tiny",
               f"--workdir={workdir}", "--config.tokenizer.vocab_size=512",
               "--config.model.max_seq_len=64", "--config.report.new_tokens=2",
               *[f"--config.train.{k}={v}" for k, v in TRAIN.items()]]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    refused = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "pass resume=True (--resume)" in refused.stderr
    done = subprocess.run(command + ["--resume"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 4 and [h["step"] for h in summary["history"]] == [1, 2, 3, 4]
    # What it prints is plain: a load call that works, labelled finish reasons, explained columns.
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("checkpoint: ")]
    path = line.split("load_checkpoint(", 1)[1].rstrip(")").strip("'")
    model, tokenizer = decodelab.load_checkpoint(path)
    assert tokenizer.vocab_size == 512
    np.testing.assert_array_equal(params_of(model)[0], params_of(first.model)[0])
    assert "finish: " in done.stdout
    explained = [x.split(":")[0].strip() for x in done.stdout.splitlines() if x.startswith("  ")]
    assert {"ppl", "distinct-2", "rep-4", "self-BLEU", "top-1", "length"} <= set(explained)


# --- A model trained on a pretrained model's tokenizer ----------------------------------------

PRETRAINED_TOKENIZER = dict(pretrained="smollm2-135m")


@pytest.fixture(scope="module")
def on_smollm2(workdir, smollm2_installed):
    """The tiny preset trained for 4 steps on the corpus in SmolLM2's tokens."""
    return pipeline.load_or_train(PRETRAINED_TOKENIZER, model_section(), TRAIN, workdir,
                                  progress=False)


@pytest.mark.slow
def test_a_pretrained_tokenizer_section_trains_on_that_vocabulary(on_smollm2, workdir):
    assert isinstance(on_smollm2.tokenizer, PretrainedTokenizer)
    assert on_smollm2.model.config.vocab_size == on_smollm2.tokenizer.vocab_size == 49152
    assert on_smollm2.step == 4 and not (workdir / "tokenizers" /
                                         pipeline.tokenizer_key(PRETRAINED_TOKENIZER)).exists()
    spec = json.loads((on_smollm2.directory / "spec.json").read_text())
    assert spec["tokenizer"] == PRETRAINED_TOKENIZER


@pytest.mark.slow
def test_a_model_on_a_pretrained_tokenizer_is_reused_with_its_tokenizer(on_smollm2, workdir,
                                                                       monkeypatch):
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("retrained"))
    again = pipeline.load_or_train(PRETRAINED_TOKENIZER, model_section(), TRAIN, workdir,
                                   progress=False)
    assert again.directory == on_smollm2.directory and again.resumed_from == 4
    model, tokenizer = checkpoint.load_checkpoint(on_smollm2.directory / "checkpoints")
    assert tokenizer.to_json() == on_smollm2.tokenizer.to_json()
    assert tokenizer.encode("To be, or not to be") == on_smollm2.tokenizer.encode(
        "To be, or not to be")
    for a, b in zip(params_of(on_smollm2.model), params_of(model), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_the_key_of_a_pretrained_tokenizer_covers_the_tokenizer_itself(on_smollm2, monkeypatch):
    key = pipeline.tokenizer_key(PRETRAINED_TOKENIZER)
    assert key != pipeline.tokenizer_key(TOKENIZER)
    other = PretrainedTokenizer.from_json(on_smollm2.tokenizer.to_json())
    other.eos_id = 0
    monkeypatch.setattr(pipeline, "_pretrained_tokenizer", lambda name: other)
    assert pipeline.tokenizer_key(PRETRAINED_TOKENIZER) != key


@pytest.mark.parametrize("tokenizer_cfg", [dict(pretrained="gpt-9"),
                                           dict(pretrained="smollm2-135m", vocab_size=512)])
def test_bad_pretrained_tokenizer_sections_are_refused_by_name(tokenizer_cfg, tmp_path):
    with pytest.raises(ValueError, match="a pretrained tokenizer_cfg must hold only pretrained = "
                                         r"one of \['smollm2-135m'\], got"):
        pipeline.tokenizer_for(tokenizer_cfg, tmp_path)


def test_trained_tokenizer_refuses_a_pretrained_section(tmp_path):
    with pytest.raises(ValueError, match="tokenizer_cfg must be a tokenizer to train"):
        pipeline.trained_tokenizer(PRETRAINED_TOKENIZER, tmp_path)


def test_load_or_train_refuses_a_pretrained_model_section(tmp_path):
    section = dict(presets.MODEL_PRESETS["tiny"], pretrained="smollm2-135m")
    with pytest.raises(ValueError, match="model_cfg_section must be an architecture to train, got "
                                         "the pretrained model 'smollm2-135m'"):
        pipeline.load_or_train(TOKENIZER, section, TRAIN, tmp_path, progress=False)


@pytest.mark.parametrize("fields, message", [
    (dict(model_cfg_section="tiny"), "teacher.model_cfg_section must be a ConfigDict section or "
                                     "a dict, got str"),
    (dict(train_cfg=[4]), "teacher.train_cfg must be a ConfigDict section or a dict, got list"),
    (dict(temperature=0.0), r"temperature must be a finite number > 0, got 0.0"),
    (dict(temperature=float("nan")), r"temperature must be a finite number > 0, got nan"),
])
def test_a_bad_teacher_is_refused_before_anything_is_trained(fields, message):
    with pytest.raises(ValueError, match=message):
        pipeline.Teacher(**{"model_cfg_section": model_section(), "train_cfg": TRAIN, **fields})
