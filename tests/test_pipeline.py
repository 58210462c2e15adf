"""Pipeline: a tokenizer and a model are trained once per configuration and reused after, an
interrupted model continues from its checkpoint, and keys follow every config that matters."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from decodelab import pipeline, presets, train
from decodelab.tokenizer import Tokenizer

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


def test_the_first_call_trains_into_the_documented_layout(first, workdir):
    assert first.resumed_from is None and first.step == 4
    assert [h["step"] for h in first.history] == [1, 2, 3, 4]
    key = pipeline.tokenizer_key(TOKENIZER)
    assert (workdir / "tokenizers" / key / "tokenizer.model").is_file()
    assert first.directory.parent == workdir / "models"
    spec = json.loads((first.directory / "spec.json").read_text())
    assert spec["train"] == train.TrainConfig(**TRAIN).to_dict()
    assert spec["model"]["vocab_size"] == 512 and spec["tokenizer"] == TOKENIZER


def test_a_finished_model_is_reused_not_retrained(first, workdir, monkeypatch):
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("retrained"))
    monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: pytest.fail("tokenizer retrained"))
    again = pipeline.load_or_train(TOKENIZER, model_section(), TRAIN, workdir, progress=False)
    assert again.resumed_from == 4 and again.step == 4 and again.history == first.history
    assert again.directory == first.directory
    assert again.tokenizer.serialized_model() == first.tokenizer.serialized_model()
    for a, b in zip(params_of(first.model), params_of(again.model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_trained_model_returns_the_model_and_its_tokenizer(first, workdir):
    model, tokenizer = pipeline.trained_model(TOKENIZER, model_section(), TRAIN, workdir,
                                              progress=False)
    assert model.config == first.model.config and tokenizer.vocab_size == 512


def test_an_interrupted_model_continues_from_its_checkpoint(first, workdir):
    tc = train.TrainConfig(**dict(TRAIN, steps=6))
    model_cfg = first.model.config
    directory = workdir / "models" / pipeline.model_key(TOKENIZER, model_cfg, tc)
    stream = np.arange(2000, dtype=np.int32) % 512  # any data: the pipeline only sees checkpoints
    train.train(model_cfg, tc, stream, tokenizer=first.tokenizer,
                checkpoint_dir=directory / "checkpoints", stop_after=2, progress=False)
    resumed = pipeline.load_or_train(TOKENIZER, model_section(), tc, workdir, progress=False)
    assert resumed.directory == directory
    assert resumed.resumed_from == 2 and resumed.step == 6
    assert [h["step"] for h in resumed.history] == [3, 4, 5, 6]


def test_resume_false_refuses_existing_checkpoints(first, workdir):
    with pytest.raises(ValueError, match=r"holds checkpoints of this model \(step 4 of 4\)"):
        pipeline.load_or_train(TOKENIZER, model_section(), TRAIN, workdir, resume=False,
                               progress=False)


def test_keys_follow_every_config_that_matters(first):
    cfg, tc = first.model.config, train.TrainConfig(**TRAIN)
    key = pipeline.model_key(TOKENIZER, cfg, tc)
    assert key == pipeline.model_key(dict(TOKENIZER), cfg, train.TrainConfig(**TRAIN))
    assert key != pipeline.model_key(TOKENIZER, cfg.replace(position="alibi"), tc)
    assert key != pipeline.model_key(TOKENIZER, cfg, dataclasses.replace(tc, seed=1))
    assert key != pipeline.model_key(dict(TOKENIZER, model_type="unigram"), cfg, tc)
    assert pipeline.tokenizer_key(TOKENIZER) != pipeline.tokenizer_key(dict(vocab_size=600))


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
