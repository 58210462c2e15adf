"""Distillation: the KL objective is exact, it draws the student towards the teacher, resuming a
distillation run is exact, and a checkpoint refuses another objective or teacher."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from standins import FakeTokenizer

import decodelab as dl
from decodelab.train import distill
from decodelab.train import trainer as train
from decodelab.train.options import RunOptions

V = 64
CFG = dl.ModelConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=32)


@pytest.fixture(scope="module")
def teacher():
    return dl.Transformer(CFG.replace(d_model=48), rngs=nnx.Rngs(7))


@pytest.fixture(scope="module")
def stream():
    return np.random.default_rng(0).integers(0, V, 4000).astype(np.int32)


def run(**changes):
    fields = dict(steps=8, batch_size=4, seq_len=16, learning_rate=1e-2, warmup_steps=1,
                  checkpoint_every=4, log_every=1)
    fields.update(changes)
    return train.TrainConfig(**fields)


def kl(teacher, student, windows):
    return float(distill.KLToTeacher(teacher, "t").loss(student, windows, nnx.state(teacher)))


def test_the_objective_is_the_mean_forward_kl_of_next_token_distributions(teacher, stream):
    student = dl.Transformer(CFG, rngs=nnx.Rngs(1))
    windows = jnp.asarray(stream[:34].reshape(2, 17))
    p = np.asarray(jax.nn.softmax(teacher(windows[:, :-1])), np.float64)
    q = np.asarray(jax.nn.softmax(student(windows[:, :-1])), np.float64)
    expected = np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=-1))
    np.testing.assert_allclose(kl(teacher, student, windows), expected, rtol=1e-5)
    assert abs(kl(teacher, teacher, windows)) < 1e-6


@pytest.mark.slow
def test_distillation_draws_the_student_towards_the_teacher(teacher, stream):
    result = distill.distill(teacher, "t", CFG, run(steps=40), stream,
                             run=RunOptions(progress=False))
    windows = jnp.asarray(stream[-170:].reshape(10, 17))
    untrained = dl.Transformer(CFG, rngs=nnx.Rngs(0))  # train's initialisation (seed 0)
    assert kl(teacher, result.model, windows) < 0.5 * kl(teacher, untrained, windows)


@pytest.mark.slow
def test_resumed_distillation_equals_an_uninterrupted_one_and_refuses_another_teacher(
        teacher, stream, tmp_path):
    tc = run()
    split = RunOptions(tokenizer=FakeTokenizer(vocab_size=V), checkpoint_dir=tmp_path / "split",
                       progress=False)
    resume = dataclasses.replace(split, resume=True)
    whole = distill.distill(teacher, "t", CFG, tc, stream,
                            run=dataclasses.replace(split, checkpoint_dir=tmp_path / "whole"))
    distill.distill(teacher, "t", CFG, tc, stream, run=dataclasses.replace(split, stop_after=4))
    with pytest.raises(ValueError, match=r"objective differs from the checkpoint's"):
        distill.distill(teacher, "another", CFG, tc, stream, run=resume)
    with pytest.raises(ValueError, match=r"objective differs from the checkpoint's"):
        train.train(CFG, tc, stream, run=resume)
    resumed = distill.distill(teacher, "t", CFG, tc, stream, run=resume)
    assert resumed.resumed_from == 4
    for a, b in zip(jax.tree.leaves(nnx.state(whole.model)),
                    jax.tree.leaves(nnx.state(resumed.model))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_settings_are_refused(teacher, stream):
    with pytest.raises(ValueError, match=r"student_cfg.vocab_size must equal the teacher's 64"):
        distill.distill(teacher, "t", CFG.replace(vocab_size=32), run(), stream)
    with pytest.raises(ValueError, match=r"temperature must be a finite number > 0, got 0"):
        distill.KLToTeacher(teacher, "t", temperature=0)
    with pytest.raises(ValueError, match=r"teacher_id must be a non-empty string"):
        distill.KLToTeacher(teacher, "")
