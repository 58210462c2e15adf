"""Training: loss falls, evaluation is exact about padding, resume equals an uninterrupted run,
checkpoints round-trip, and bad settings are refused by name."""

import dataclasses
import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from standins import TINY

import decodelab as dl
from decodelab.text import data
from decodelab.text.data import PackedBatches
from decodelab.text.tokenizer import Tokenizer
from decodelab.train import checkpoint
from decodelab.train import trainer as train
from decodelab.train.options import RunOptions


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    path = directory / "play.txt"
    path.write_text(data.split_documents("train")["hamlet"], encoding="utf-8")
    return Tokenizer.train([path], vocab_size=512, model_type="bpe")


@pytest.fixture(scope="module")
def stream(tokenizer):
    text = data.split_documents("train")["hamlet"]
    return np.asarray(tokenizer.encode(text, add_bos=True, add_eos=True), np.int32)


@pytest.fixture(scope="module")
def model_cfg(tokenizer):
    return dl.ModelConfig(**{**TINY, "vocab_size": tokenizer.vocab_size}, position="rope")


def small_run(**changes):
    fields = dict(steps=12, batch_size=4, seq_len=32, learning_rate=3e-3, warmup_steps=2,
                  checkpoint_every=4, log_every=1)
    fields.update(changes)
    return train.TrainConfig(**fields)


QUIET = RunOptions(progress=False)


def checkpointed(tokenizer, directory, **changes):
    """Run options that checkpoint to ``directory``, without a progress bar."""
    return RunOptions(tokenizer=tokenizer, checkpoint_dir=directory, progress=False, **changes)


def params_of(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_loss_falls_on_real_text(model_cfg, stream):
    result = train.train(model_cfg, small_run(steps=60, warmup_steps=5), stream, run=QUIET)
    losses = [h["loss"] for h in result.history]
    assert len(losses) == 60
    # From ~ln(512) = 6.2 at init, a working step must gain well over a nat in 60 steps.
    assert np.mean(losses[-5:]) < losses[0] - 1.5, losses


@pytest.mark.slow
def test_resume_reaches_the_same_parameters_as_an_uninterrupted_run(model_cfg, stream, tokenizer,
                                                                      tmp_path):
    tc = small_run()
    whole = train.train(model_cfg, tc, stream, run=checkpointed(tokenizer, tmp_path / "whole"))
    first = train.train(model_cfg, tc, stream,
                        run=checkpointed(tokenizer, tmp_path / "split", stop_after=5))
    assert first.step == 5
    resumed = train.train(model_cfg, tc, stream,
                          run=checkpointed(tokenizer, tmp_path / "split", resume=True))
    assert resumed.resumed_from == 5 and resumed.step == 12
    for a, b in zip(params_of(whole.model), params_of(resumed.model), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_resume_of_a_finished_run_trains_nothing(model_cfg, stream, tokenizer, tmp_path):
    tc = small_run(steps=4)
    done = train.train(model_cfg, tc, stream, run=checkpointed(tokenizer, tmp_path))
    again = train.train(model_cfg, tc, stream, run=checkpointed(tokenizer, tmp_path, resume=True))
    assert again.resumed_from == 4 and again.history == []
    for a, b in zip(params_of(done.model), params_of(again.model), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_existing_checkpoints_without_resume_are_refused(model_cfg, stream, tokenizer, tmp_path):
    train.train(model_cfg, small_run(steps=4), stream, run=checkpointed(tokenizer, tmp_path))
    with pytest.raises(ValueError, match="resume=True"):
        train.train(model_cfg, small_run(steps=4), stream, run=checkpointed(tokenizer, tmp_path))


@pytest.mark.slow
def test_resume_with_a_different_model_config_is_refused(model_cfg, stream, tokenizer, tmp_path):
    train.train(model_cfg, small_run(steps=4), stream, run=checkpointed(tokenizer, tmp_path))
    with pytest.raises(ValueError, match="model config differs"):
        train.train(model_cfg.replace(position="alibi"), small_run(steps=4), stream,
                    run=checkpointed(tokenizer, tmp_path, resume=True))


def test_evaluate_counts_every_window_once_whatever_the_batch_size(model_cfg, stream):
    model = dl.Transformer(model_cfg, rngs=nnx.Rngs(0))
    windows = data.eval_windows(stream[:2000], 32)
    a = train.evaluate(model, windows, batch_size=3)
    b = train.evaluate(model, windows, batch_size=64)
    assert a["tokens"] == b["tokens"] == windows.shape[0] * 32
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    assert a["perplexity"] == pytest.approx(np.exp(a["loss"]), rel=1e-12)


@pytest.fixture(scope="module")
def padded_checkpoint(model_cfg, tokenizer, tmp_path_factory):
    """``(model, loaded model, loaded tokenizer)``: a model whose vocabulary of 640 ids is padded
    past its tokenizer's 512 (as nanoGPT pads GPT-2's 50257 ids to 50304), saved and loaded."""
    model = dl.Transformer(model_cfg.replace(vocab_size=640), rngs=nnx.Rngs(3))
    path = tmp_path_factory.mktemp("padded") / "ckpt"
    dl.save_checkpoint(path, model, tokenizer)
    return (model, *dl.load_checkpoint(path))


def test_checkpoint_round_trip_gives_identical_logits_and_tokenizer(padded_checkpoint, tokenizer):
    model, loaded, loaded_tok = padded_checkpoint
    assert loaded.config == model.config and loaded.config.vocab_size == 640
    assert loaded_tok.serialized_model() == tokenizer.serialized_model()
    tokens = np.asarray([tokenizer.encode("To be, or not to be: that is the question.")], np.int32)
    np.testing.assert_array_equal(np.asarray(model(tokens)), np.asarray(loaded(tokens)))


def test_load_checkpoint_errors_name_the_problem(tmp_path, model_cfg, tokenizer):
    with pytest.raises(ValueError, match="path must be an existing checkpoint directory"):
        dl.load_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no checkpoint found"):
        dl.load_checkpoint(tmp_path / "empty")
    dl.save_checkpoint(tmp_path / "one", dl.Transformer(model_cfg, rngs=nnx.Rngs(0)), tokenizer)
    with pytest.raises(ValueError, match=r"step must be one of the saved steps \[0\], got 7"):
        dl.load_checkpoint(tmp_path / "one", step=7)


@pytest.mark.parametrize("field, value, message", [
    ("steps", 0, "steps must be an int >= 1, got 0"),
    ("batch_size", -1, "batch_size must be an int >= 1, got -1"),
    ("warmup_steps", 20, r"warmup_steps must be an int in \[0, steps=12\]"),
    ("seed", -1, "seed must be an int >= 0, got -1"),
    ("learning_rate", 0.0, r"learning_rate must be a finite number in \(0, 1.0\], got 0.0"),
    ("learning_rate", 1e30, r"learning_rate must be a finite number in \(0, 1.0\], got 1e\+30"),
    ("learning_rate", float("nan"), "learning_rate must be a finite number"),
    ("grad_clip", -1.0, "grad_clip must be a finite number > 0, got -1.0"),
    ("grad_clip", float("inf"), "grad_clip must be a finite number"),
    ("weight_decay", -0.1, r"weight_decay must be a finite number in \[0, 1\], got -0.1"),
    ("weight_decay", 5.0, r"weight_decay must be a finite number in \[0, 1\], got 5.0"),
    ("b1", 1.0, r"b1 must be a finite number in \[0, 1\), got 1.0"),
    ("b1", -0.1, r"b1 must be a finite number in \[0, 1\), got -0.1"),
    ("b2", 1.0, r"b2 must be a finite number in \[0, 1\), got 1.0"),
    ("b2", 1.5, r"b2 must be a finite number in \[0, 1\), got 1.5"),
    ("final_lr_fraction", 2.0, r"final_lr_fraction must be a finite number in \[0, 1\]"),
])
def test_train_config_rejects_bad_fields_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        small_run(**{field: value})


def test_train_refuses_sequences_longer_than_a_learned_table(tokenizer, stream):
    cfg = dl.ModelConfig(**{**TINY, "vocab_size": tokenizer.vocab_size}, position="learned")
    with pytest.raises(ValueError, match="seq_len must be <= max_seq_len=64"):
        train.train(cfg, small_run(seq_len=128), stream, run=QUIET)


@dataclasses.dataclass(frozen=True)
class NaNOnBatch(train.Objective):
    """Next-token loss, but NaN on one given batch: a divergence at a step the test chooses."""

    batch: np.ndarray

    def loss(self, model, windows, aux):
        nll = train.NextToken().loss(model, windows, None)
        return jnp.where(jnp.all(windows == aux), jnp.nan, nll)

    def aux(self):
        return jnp.asarray(self.batch)

    def to_dict(self):
        return {"name": "nan_on_batch"}


def nan_at_step(stream, tc, step):
    """An objective whose loss is NaN at (1-based) ``step`` of a run of ``tc`` on ``stream``."""
    return NaNOnBatch(PackedBatches(stream, tc.batch_size, tc.seq_len, tc.seed).batch(step - 1))


@pytest.mark.slow
def test_a_non_finite_loss_stops_training_naming_its_step_and_nothing_after_is_saved(
        model_cfg, stream, tokenizer, tmp_path):
    # Found at step 4 (the first step that logs), named as step 3; the save at step 4 is skipped.
    tc = small_run(steps=8, checkpoint_every=2, log_every=4)
    with pytest.raises(train.TrainingDiverged, match=r"not finite at step 3 \(of 8\).*Likely "
                                                     r"cause: a learning rate too high"):
        train.train(model_cfg, tc, stream, run=checkpointed(tokenizer, tmp_path),
                    objective=nan_at_step(stream, tc, 3))
    manager = checkpoint.open_manager(tmp_path, read_only=True)
    assert manager.all_steps() == [2]


def test_a_model_with_non_finite_parameters_is_never_saved(model_cfg, tokenizer, tmp_path):
    model = dl.Transformer(model_cfg, rngs=nnx.Rngs(0))
    model.embed.embedding[...] = model.embed.embedding[...].at[0, 0].set(jnp.inf)
    with pytest.raises(ValueError, match=r"parameters must be finite to be saved as step 0 in "
                                         r".*got NaN or infinite values in \[\"\['embed'\]"):
        dl.save_checkpoint(tmp_path / "ckpt", model, tokenizer)
    assert not list((tmp_path / "ckpt").glob("0*"))


def test_evaluate_refuses_non_finite_parameters(model_cfg, stream):
    model = dl.Transformer(model_cfg, rngs=nnx.Rngs(0))
    model.embed.embedding[...] = model.embed.embedding[...].at[3, 1].set(jnp.nan)
    with pytest.raises(ValueError, match=r"model must have finite parameters to evaluate, got NaN "
                                         r"or infinite values in \[\"\['embed'\]"):
        train.evaluate(model, data.eval_windows(stream[:200], 32))


# --- Damaged checkpoints -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(model_cfg, tokenizer, tmp_path_factory):
    """A checkpoint of two steps (1 and 2) of different models, as a training run keeps."""
    path = tmp_path_factory.mktemp("saved") / "ckpt"
    manager = checkpoint.open_manager(path)
    for step in (1, 2):
        checkpoint.save(manager, step, nnx.state(dl.Transformer(model_cfg, rngs=nnx.Rngs(step))),
                        checkpoint.make_meta(model_cfg, tokenizer, step))
    manager.close()
    return path


def largest_array_file(step_dir):
    return max((step_dir / "params").rglob("d/*"), key=lambda f: f.stat().st_size)


def truncate(step_dir):
    f = largest_array_file(step_dir)
    f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])


def garble(step_dir):
    f = largest_array_file(step_dir)
    data_ = bytearray(f.read_bytes())
    data_[64::97] = bytes(b ^ 0xFF for b in data_[64::97])
    f.write_bytes(bytes(data_))


META = "meta/metadata"
# mode -> (damage a step's folder, the part named, the file named relative to the step's folder)
DAMAGE = {
    "truncated array file": (truncate, "parameters", largest_array_file),
    "garbled array file": (garble, "parameters", largest_array_file),
    "missing metadata file": (lambda d: (d / META).unlink(), "metadata", META),
    "malformed metadata": (lambda d: (d / META).write_text("{not json"), "metadata", META),
    "metadata without a model config": (lambda d: (d / META).write_text('{"step": 2}'),
                                        "model config", META),
    "metadata with a bad tokenizer": (
        lambda d: (d / META).write_text(json.dumps(
            {**json.loads((d / META).read_text()), "tokenizer": "bm90IGEgbW9kZWw="})),
        "tokenizer", META),
    "empty manifest": (lambda d: (d / "params/manifest.ocdbt").write_bytes(b""), "parameters",
                       "params/manifest.ocdbt"),
    "missing array metadata": (lambda d: (d / "params/_METADATA").unlink(), "parameters",
                               "params"),
    "missing parameters": (lambda d: shutil.rmtree(d / "params"), "parameters", "params"),
}


@pytest.mark.parametrize("mode", list(DAMAGE))
def test_a_damaged_step_is_a_value_error_naming_the_checkpoint_the_part_and_the_file(
        saved, tmp_path, mode):
    damage, part, file = DAMAGE[mode]
    path = tmp_path / "ckpt"
    shutil.copytree(saved, path)
    file = path / "2" / file if isinstance(file, str) else file(path / "2")
    damage(path / "2")
    with pytest.raises(checkpoint.DamagedCheckpoint,
                       match=f"checkpoint '{path}' step 2 is damaged: its {part} cannot be read "
                             f"from '{file}"):
        dl.load_checkpoint(path, step=2)


def test_a_damaged_latest_step_falls_back_to_the_last_intact_one_with_a_warning(
        saved, tmp_path, model_cfg):
    path = tmp_path / "ckpt"
    shutil.copytree(saved, path)
    truncate(path / "2")
    with pytest.warns(UserWarning, match=r"step 2 is damaged: its parameters .*; using step 1, "
                                         r"the latest intact one"):
        model, _ = dl.load_checkpoint(path)
    expected = dl.Transformer(model_cfg, rngs=nnx.Rngs(1))
    for a, b in zip(params_of(expected), params_of(model), strict=True):
        np.testing.assert_array_equal(a, b)
    truncate(path / "1")
    with pytest.raises(ValueError, match=r"step 2 is damaged: .*no earlier step is intact either "
                                         r"\(steps \[1, 2\] in "):
        dl.load_checkpoint(path)


# --- Paths and overwriting ------------------------------------------------------------------------


def test_every_checkpoint_and_tokenizer_path_is_checked_by_name(model_cfg, tokenizer, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = dl.Transformer(model_cfg, rngs=nnx.Rngs(0))
    file = tmp_path / "file"
    file.write_text("x")
    # call -> (a path of the other kind, its message, whether the call writes)
    calls = {
        lambda p: dl.save_checkpoint(p, model, tokenizer): (file, "a directory, got a file", True),
        dl.load_checkpoint: (file, "a checkpoint directory, got a file", False),
        tokenizer.save: (tmp_path, "a file, got a directory", True),
        Tokenizer.load: (tmp_path, "a tokenizer model file, got a directory", False),
        lambda p: train.train(model_cfg, small_run(), np.zeros(64, np.int32),
                              run=checkpointed(tokenizer, p)): (file, "a directory, got a file",
                                                                True),
    }
    for call, (other, message, writes) in calls.items():
        with pytest.raises(ValueError, match=r" must be a non-empty path .*, got ''$"):
            call("")
        with pytest.raises(ValueError, match=f" must be {message}: '{other}'$"):
            call(other)
        if writes:
            with pytest.raises(ValueError, match=f"must be a path this process can write, got "
                                                 f"'{file / 'x'}': cannot write '{file}"):
                call(file / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written to "./0/"


def test_saving_over_a_checkpoint_needs_overwrite_which_replaces_it_whole(model_cfg, tokenizer,
                                                                          tmp_path):
    old, new = (dl.Transformer(model_cfg, rngs=nnx.Rngs(seed)) for seed in (0, 1))
    path = tmp_path / "ckpt"
    dl.save_checkpoint(path, old, tokenizer, step=3)
    with pytest.raises(ValueError, match=rf"path '{path}' already holds a checkpoint \(steps "
                                         r"\[3\]\); pass overwrite=True to replace it"):
        dl.save_checkpoint(path, new, tokenizer)
    (tmp_path / ".ckpt.new").mkdir()  # left by a save that crashed
    dl.save_checkpoint(path, new, tokenizer, overwrite=True)
    assert sorted(p.name for p in path.iterdir()) == ["0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    loaded, _ = dl.load_checkpoint(path)
    for a, b in zip(params_of(new), params_of(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    (path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds other files besides its checkpoint "
                                         r"\(\['notes.txt'\]\)"):
        dl.save_checkpoint(path, old, tokenizer, overwrite=True)


def test_an_overwrite_that_fails_midway_leaves_the_old_checkpoint_intact(model_cfg, tokenizer,
                                                                         tmp_path, monkeypatch):
    old = dl.Transformer(model_cfg, rngs=nnx.Rngs(0))
    path = tmp_path / "ckpt"
    dl.save_checkpoint(path, old, tokenizer)
    real_save = checkpoint.save

    def save_then_crash(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt  # after the new checkpoint is written, before it replaces the old

    monkeypatch.setattr(checkpoint, "save", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        dl.save_checkpoint(path, dl.Transformer(model_cfg, rngs=nnx.Rngs(1)), tokenizer,
                           overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    loaded, _ = dl.load_checkpoint(path)
    for a, b in zip(params_of(old), params_of(loaded), strict=True):
        np.testing.assert_array_equal(a, b)


# --- A damaged latest step of a training run -----------------------------------------------------


@pytest.fixture(scope="module")
def run_of_two_steps(model_cfg, stream, tokenizer, tmp_path_factory):
    """A finished run of 8 steps with checkpoints at steps 4 and 8, and its final model."""
    path = tmp_path_factory.mktemp("run") / "ckpt"
    done = train.train(model_cfg, small_run(steps=8, log_every=4), stream,
                       run=checkpointed(tokenizer, path))
    return path, done.model


@pytest.mark.slow
@pytest.mark.parametrize("damage", [truncate, garble])
def test_resume_falls_back_from_a_damaged_latest_step_and_writes_it_again(
        run_of_two_steps, model_cfg, stream, tokenizer, tmp_path, damage):
    saved, whole = run_of_two_steps
    path = tmp_path / "ckpt"
    shutil.copytree(saved, path)
    file = largest_array_file(path / "8")
    damage(path / "8")
    with pytest.warns(UserWarning) as caught:
        resumed = train.train(model_cfg, small_run(steps=8, log_every=4), stream,
                              run=checkpointed(tokenizer, path, resume=True))
    # One warning about the checkpoint (the suite's other threads may warn meanwhile, e.g. of a
    # fork, which pytest.warns records too).
    [warning] = [str(w.message) for w in caught if str(w.message).startswith("checkpoint ")]
    assert warning.startswith(f"checkpoint '{path}' step 8 is damaged: its parameters cannot be "
                              f"read from '{file}' (")
    assert warning.endswith("; using step 4, the latest intact one") and "\n" not in warning
    assert resumed.resumed_from == 4 and resumed.step == 8
    for a, b in zip(params_of(whole), params_of(resumed.model), strict=True):
        np.testing.assert_array_equal(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # step 8 written again, intact: no fallback
        loaded, _ = dl.load_checkpoint(path)
    for a, b in zip(params_of(whole), params_of(loaded), strict=True):
        np.testing.assert_array_equal(a, b)


def test_save_checkpoint_refuses_a_tokenizer_larger_than_the_model(model_cfg, tokenizer, tmp_path):
    model = dl.Transformer(model_cfg.replace(vocab_size=400), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="^tokenizer has 512 ids but the model's vocabulary has "
                                         "400; a tokenizer must have at most"):
        dl.save_checkpoint(tmp_path / "ckpt", model, tokenizer)
    assert not (tmp_path / "ckpt").exists()  # refused before anything is written


def test_a_padded_vocabulary_never_samples_its_padding_with_the_loaded_tokenizer(
        padded_checkpoint):
    """Generation with the loaded tokenizer never picks an id past it, greedy or sampled, though
    the padding's logits are made the largest."""
    _, loaded, loaded_tok = padded_checkpoint
    prompt = loaded_tok.encode("To be, or not to be")
    params = dl.SamplingParams(temperature=[0.0, 1.0],
                               logit_bias={i: 100.0 for i in range(512, 640)})
    bare = dl.generate(loaded, [prompt] * 2, params, 8, seed=0)
    assert (bare.tokens >= 512).all()
    out = dl.generate(loaded, [prompt] * 2, params, 8, seed=0,
                      options=dl.DecodeOptions(tokenizer=loaded_tok))
    assert ((0 <= out.tokens) & (out.tokens < 512)).all()
    assert loaded_tok.decode(out.token_lists()[1])  # the tokenizer reads every id


@pytest.mark.parametrize("fields, message", [
    (dict(checkpoint_dir=3), "checkpoint_dir must be None or a path, got 3"),
    (dict(checkpoint_dir="ckpt"), r"tokenizer must be given with checkpoint_dir"),
    (dict(resume="yes"), "resume must be a bool, got 'yes'"),
    (dict(progress=1), "progress must be a bool, got 1"),
    (dict(stop_after=0), "stop_after must be an int >= 1, got 0"),
    (dict(extra_meta={1: "a"}), r"extra_meta must be None or a dict with str keys, got \{1: 'a'\}"),
])
def test_run_options_reject_bad_fields_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        RunOptions(**fields)


def test_train_refuses_a_stop_after_past_the_run_and_options_that_are_not_run_options(
        model_cfg, stream):
    with pytest.raises(ValueError, match=r"stop_after must be in \[1, steps=4\], got 5"):
        train.train(model_cfg, small_run(steps=4), stream, run=RunOptions(stop_after=5))
    with pytest.raises(ValueError, match="run must be a train.RunOptions, got"):
        train.train(model_cfg, small_run(steps=4), stream, run={"progress": False})
