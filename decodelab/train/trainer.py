"""Training: a jit-compiled AdamW step over packed token windows, validation perplexity, and
resumable Orbax checkpoints.

Determinism is the contract that makes ``resume`` exact: there is no dropout, the batch at step
``i`` is a pure function of ``(seed, i)`` (``data.PackedBatches``), and a checkpoint holds the
parameters and the optimizer state (whose step count drives the learning-rate schedule). A run
stopped at step k and resumed therefore reaches the same parameters as one that never stopped.

What is minimised is an ``Objective``: next-token cross-entropy by default, or e.g. distillation
to a fixed teacher (``decodelab.train.distill``). A checkpoint records its objective, and resuming
with another one is refused, so the guarantee holds for any deterministic objective.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from tqdm.auto import tqdm

from decodelab import sharding
from decodelab.checks import check_int, check_number, check_path, is_int
from decodelab.config import ModelConfig
from decodelab.model import Transformer
from decodelab.model.losses import window_nll
from decodelab.text.data import PackedBatches
from decodelab.train import checkpoint
from decodelab.train.options import RunOptions

# The largest peak learning rate TrainConfig accepts.
MAX_LEARNING_RATE = 1.0


class TrainingDiverged(ValueError):
    """The loss or the gradient stopped being finite; nothing from that step on was saved."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation settings. The schedule is linear warmup then cosine decay to a floor."""

    # Optimiser steps in the whole run.
    steps: int = 1000
    # Sequences per step.
    batch_size: int = 16
    # Tokens per training sequence (the model sees positions 0 .. seq_len-1).
    seq_len: int = 128
    # Peak learning rate, reached at the end of warmup.
    learning_rate: float = 3e-3
    # Linear warmup steps from 0 to the peak.
    warmup_steps: int = 100
    # Final learning rate as a fraction of the peak.
    final_lr_fraction: float = 0.1
    # AdamW decoupled weight decay, applied to matrices only (not norms).
    weight_decay: float = 0.1
    # Clip the global gradient norm to this value.
    grad_clip: float = 1.0
    # Adam moment decay rates.
    b1: float = 0.9
    b2: float = 0.95
    # Seed for the initial parameters and the data order.
    seed: int = 0
    # Save a checkpoint every this many steps (and at the end).
    checkpoint_every: int = 200
    # Refresh the progress bar's loss every this many steps (fetching it syncs the device).
    log_every: int = 10

    def __post_init__(self) -> None:
        # Stored as Python ints (a NumPy int would not survive the JSON of a checkpoint).
        for name in ("steps", "batch_size", "seq_len", "checkpoint_every", "log_every"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if not is_int(self.warmup_steps) or not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must be an int in [0, steps={self.steps}], "
                             f"got {self.warmup_steps!r}")
        object.__setattr__(self, "warmup_steps", int(self.warmup_steps))
        object.__setattr__(self, "seed", check_int("seed", self.seed, 0))
        # Ranges in which AdamW means something: a step moves each parameter by about the
        # learning rate, so past 1 it only diverges; a moment decay of 1 never forgets the zero
        # it starts from (Adam divides by 1 - b**t = 0: NaN at the first step).
        check_number("learning_rate", self.learning_rate, 0, MAX_LEARNING_RATE, open_low=True)
        check_number("grad_clip", self.grad_clip, 0, open_low=True)
        check_number("weight_decay", self.weight_decay, 0, 1)
        check_number("final_lr_fraction", self.final_lr_fraction, 0, 1)
        for name in ("b1", "b2"):
            check_number(name, getattr(self, name), 0, 1, open_high=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=tc.learning_rate, warmup_steps=tc.warmup_steps,
        decay_steps=tc.steps, end_value=tc.learning_rate * tc.final_lr_fraction,
    )
    decay_matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(tc.grad_clip),
        optax.adamw(schedule, b1=tc.b1, b2=tc.b2, weight_decay=tc.weight_decay,
                    mask=decay_matrices),
    )


class Objective(abc.ABC):
    """What training minimises: a scalar loss of the model on a batch of windows ``[B, T+1]``."""

    @abc.abstractmethod
    def loss(self, model: Transformer, windows: jax.Array, aux: Any) -> jax.Array:
        """The mean loss; ``aux`` is ``self.aux()`` as traced arrays."""

    def aux(self) -> Any:
        """Arrays the loss needs besides the model (e.g. a teacher's weights): arguments of the
        compiled step, not constants baked into it. None by default."""
        return None

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """What identifies the objective: stored with checkpoints, compared on resume."""


@dataclasses.dataclass(frozen=True)
class NextToken(Objective):
    """Mean next-token cross-entropy (nats): each window's first T tokens predict its last T."""

    def loss(self, model, windows, aux):
        return window_nll(model, windows).mean()

    def to_dict(self):
        return {"name": "next_token"}


def make_train_step(graphdef, tx: optax.GradientTransformation,
                    objective: Objective = NextToken()):
    """``step(params, opt_state, batch [B, T+1], aux) -> (params, opt_state, metrics)``, jitted,
    with the old parameters and optimizer state donated (updated in place); ``aux`` is
    ``objective.aux()``."""

    def loss_fn(params, batch, aux):
        return objective.loss(nnx.merge(graphdef, params), batch, aux)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, batch, aux):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, aux)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return step


def _masked(mask) -> optax.GradientTransformation:
    """Updates times ``mask`` (a tree of the parameters' structure), after every other step."""

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u, m: u * jnp.asarray(m, u.dtype), updates, mask), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@jax.jit
def _note_nonfinite(first_bad, loss, grad_norm, step):
    """``first_bad``, or ``step`` if it is the first whose loss or gradient norm is not finite."""
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    return jnp.where((first_bad == 0) & ~finite, step, first_bad)


@functools.partial(jax.jit, static_argnums=0)
def _masked_nll_sum(graphdef, params, windows, weights):  # weights [B]: 1 real row, 0 padding
    nll = window_nll(nnx.merge(graphdef, params), windows)  # [B, T]
    return (nll.sum(axis=1) * weights).sum()


def evaluate(model: Transformer, windows: np.ndarray, batch_size: int = 16) -> dict[str, float]:
    """Mean token loss (nats) and perplexity over ``windows: [N, T+1]`` (each window's first T
    tokens predict its last T). The last batch is padded and masked, so every window counts once."""
    windows = np.asarray(windows, np.int32)
    if windows.ndim != 2 or windows.shape[0] == 0 or windows.shape[1] < 2:
        raise ValueError(f"windows must have shape [N >= 1, T+1 >= 2], got {windows.shape}")
    graphdef, params = nnx.split(model)
    bad = checkpoint.nonfinite_arrays(nnx.to_pure_dict(params))
    if bad:
        raise ValueError(f"model must have finite parameters to evaluate, got NaN or infinite "
                         f"values in {bad[:5]}{' ...' if len(bad) > 5 else ''}")
    total = 0.0
    for start in range(0, len(windows), batch_size):
        chunk = windows[start:start + batch_size]
        weights = np.zeros((batch_size,), np.float32)
        weights[:len(chunk)] = 1.0
        padded = np.zeros((batch_size, windows.shape[1]), np.int32)
        padded[:len(chunk)] = chunk
        total += float(_masked_nll_sum(graphdef, params, padded, weights))
    tokens = windows.shape[0] * (windows.shape[1] - 1)
    loss = total / tokens
    if not math.isfinite(loss):
        raise ValueError(f"the mean loss over windows is {loss}: the model's logits overflow "
                         f"(finite parameters, non-finite activations)")
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": tokens}


def _check_spans_processes(mesh: Mesh | None) -> None:
    """In a run over several processes, every process must hold part of the training mesh."""
    processes = (set() if mesh is None else
                 {device.process_index for device in mesh.devices.flat})
    if processes != set(range(jax.process_count())):
        shape = "none" if mesh is None else " x ".join(f"{k}={v}" for k, v in mesh.shape.items())
        raise ValueError(f"mesh must span the devices of all {jax.process_count()} processes "
                         f"({jax.device_count()} devices) in a multi-process run, got mesh "
                         f"{shape} over the devices of processes {sorted(processes)}; make "
                         f"data x model equal to the device count")


def _check_resumable(meta: dict[str, Any], saved: ModelConfig, model_cfg: ModelConfig,
                     tc: TrainConfig, objective: Objective, checkpoint_dir) -> None:
    """A checkpoint continues only the run that wrote it: same model, training and objective."""
    if saved != model_cfg:
        raise ValueError(f"model config differs from the checkpoint's in "
                         f"{str(checkpoint_dir)!r}: got {model_cfg}, saved {saved}")
    if meta.get("train_config") not in (None, tc.to_dict()):
        raise ValueError(f"train config differs from the checkpoint's: got {tc.to_dict()}, "
                         f"saved {meta['train_config']}")
    saved_objective = meta.get("objective", NextToken().to_dict())
    if saved_objective != objective.to_dict():
        raise ValueError(f"objective differs from the checkpoint's in "
                         f"{str(checkpoint_dir)!r}: got {objective.to_dict()}, saved "
                         f"{saved_objective}")


@dataclasses.dataclass
class TrainResult:
    model: Transformer
    step: int
    history: list[dict[str, float]]  # one entry per log interval: step, loss, tokens_per_s
    resumed_from: int | None


def train(
    model_cfg: ModelConfig,
    tc: TrainConfig,
    train_stream: np.ndarray,
    *,
    run: RunOptions = RunOptions(),
    objective: Objective = NextToken(),
    mesh: Mesh | None = None,
    init: Transformer | None = None,
    update_mask: Any = None,
) -> TrainResult:
    """Train a Transformer of ``model_cfg`` on ``train_stream`` (int token ids ``[N]``) to
    minimise ``objective`` (next-token cross-entropy by default).

    ``run`` (a ``RunOptions``) controls the run. With its ``checkpoint_dir`` (which needs
    ``tokenizer``: every checkpoint stores it, and ``extra_meta`` in its metadata), checkpoints
    are written every ``tc.checkpoint_every`` steps and at the end. ``resume=True`` continues from
    the latest checkpoint there; a directory that already holds checkpoints without ``resume`` is
    an error rather than a silent overwrite. ``stop_after`` ends the run early at that step (as an
    interruption would), for tests and for splitting a run. ``mesh`` (``sharding.make_mesh``)
    trains data- and tensor-parallel: parameters and optimizer state laid out by
    ``sharding.PARAM_RULES``, batches split over its ``data`` axis. In a run over several
    processes (``jax.distributed``) every process calls this with the same arguments and a mesh
    spanning all of them; each computes the same batch (a function of the seed and the step), and
    the checkpoints are written together (Orbax, to a directory every process sees).

    ``init`` starts from that model's weights (its config must be ``model_cfg``) instead of a
    fresh initialisation: fine-tuning, e.g. a pruned model's recovery. ``update_mask`` (a tree
    like ``nnx.state(model)`` of arrays broadcastable to each parameter, e.g.
    ``prune.update_mask``) multiplies every update, weight decay included, so a parameter where it
    is 0 never changes: a pruned weight stays zero.

    A loss or gradient that stops being finite raises ``TrainingDiverged`` naming the first such
    step, at the next step that logs or saves; no checkpoint from that step on is written.
    """
    if not isinstance(run, RunOptions):
        raise ValueError(f"run must be a train.RunOptions, got {run!r}")
    checkpoint_dir, tokenizer, resume = run.checkpoint_dir, run.tokenizer, run.resume
    if checkpoint_dir is not None:
        check_path("checkpoint_dir", checkpoint_dir, "directory", write=True)
    stop_after, progress, extra_meta = run.stop_after, run.progress, run.extra_meta
    if stop_after is not None and not 1 <= stop_after <= tc.steps:
        raise ValueError(f"stop_after must be in [1, steps={tc.steps}], got {stop_after!r}")
    if model_cfg.param_dtype != "float32":
        raise ValueError(f"model_cfg.param_dtype must be 'float32' for training (the optimizer "
                         f"updates float32 parameters), got {model_cfg.param_dtype!r}; train in "
                         "float32, then store the weights in 16 bits with "
                         "decodelab.quantize(model, weights=...)")
    if model_cfg.position == "learned" and tc.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"seq_len must be <= max_seq_len={model_cfg.max_seq_len} for a learned "
                         f"position table, got {tc.seq_len}")
    if jax.process_count() > 1:
        _check_spans_processes(mesh)
    if init is not None and init.config != model_cfg:
        raise ValueError(f"init must be a model of model_cfg, got config {init.config}")
    batches = PackedBatches(train_stream, tc.batch_size, tc.seq_len, tc.seed)
    tx = make_optimizer(tc)
    if update_mask is not None:
        tx = optax.chain(tx, _masked(update_mask))
    if init is not None:  # copies: the train step donates its parameters, init keeps its own
        init_graph, init_state = nnx.split(init)
        model = nnx.merge(init_graph, jax.tree.map(jnp.copy, init_state))
    else:
        model = Transformer(model_cfg, rngs=nnx.Rngs(tc.seed))
    if mesh is not None:
        model = sharding.shard(model, mesh)
    graphdef, params = nnx.split(model)
    if update_mask is not None and (jax.tree.structure(update_mask)
                                    != jax.tree.structure(params)):
        raise ValueError(f"update_mask must be a tree like nnx.state(model) (one array per "
                         f"parameter, e.g. prune.update_mask(model)), got "
                         f"{jax.tree.structure(update_mask)}")
    opt_state = tx.init(params)
    start, resumed_from, manager = 0, None, None

    if checkpoint_dir is not None:
        manager = checkpoint.open_manager(checkpoint_dir)
        steps = sorted(manager.all_steps(), reverse=True)
        if steps and not resume:
            raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} already holds checkpoints "
                             f"(latest step {steps[0]}); pass resume=True to continue it or use "
                             f"a new directory")
        if steps:
            opt_state_like = jax.eval_shape(tx.init, params)

            def restore(step: int):
                meta = checkpoint.restore_meta(manager, step)
                _check_resumable(meta, checkpoint.meta_config(manager, step, meta), model_cfg,
                                 tc, objective, checkpoint_dir)
                return checkpoint.restore(manager, step, model_cfg, opt_state_like, mesh=mesh)

            # A damaged latest step (a crash or a full disk while it was written) falls back,
            # with a warning, to the latest intact one; the run then writes the later steps again.
            start, (restored, opt_state) = checkpoint.newest_intact(manager, steps, restore)
            params = nnx.state(restored)
            resumed_from = start

    def save(step_done: int) -> None:
        if manager is not None:
            meta = checkpoint.make_meta(model_cfg, tokenizer, step_done, train_config=tc.to_dict(),
                                        objective=objective.to_dict(), **(extra_meta or {}))
            if step_done in manager.all_steps():  # a damaged step resume fell back from
                manager.delete(step_done)
            checkpoint.save(manager, step_done, params, meta, opt_state)

    train_step = make_train_step(graphdef, tx, objective)
    aux = objective.aux()
    # The first step whose loss or gradient was not finite (0: none yet), kept on the device and
    # read at the steps that sync anyway (logging, saving, the end).
    first_bad = jnp.zeros((), jnp.int32)

    def check_finite() -> None:
        bad = int(first_bad)
        if bad:
            raise TrainingDiverged(
                f"training diverged: the loss or the gradient is not finite at step {bad} (of "
                f"{tc.steps}); no checkpoint from step {bad} on was saved. Likely cause: a "
                f"learning rate too high for this model (learning_rate={tc.learning_rate}, "
                f"reached at step {tc.warmup_steps}) or too little gradient clipping "
                f"(grad_clip={tc.grad_clip}); lower them and start a new run")

    end = tc.steps if stop_after is None else stop_after
    history: list[dict[str, float]] = []
    bar = tqdm(total=tc.steps, initial=start, disable=not progress, desc="train", unit="step",
               dynamic_ncols=True)
    tokens_per_step = tc.batch_size * tc.seq_len
    last_time, last_step = time.perf_counter(), start
    step = start
    try:
        for step in range(start, end):
            params, opt_state, metrics = train_step(params, opt_state, batches.batch(step), aux)
            done = step + 1
            first_bad = _note_nonfinite(first_bad, metrics["loss"], metrics["grad_norm"], done)
            if done % tc.log_every == 0 or done == end:
                check_finite()
                loss = float(metrics["loss"])  # syncs: the rate below is honest
                now = time.perf_counter()
                rate = (done - last_step) * tokens_per_step / max(now - last_time, 1e-9)
                last_time, last_step = now, done
                history.append({"step": done, "loss": loss, "tokens_per_s": rate})
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
            bar.update(1)
            if done % tc.checkpoint_every == 0 or done == end:
                check_finite()
                save(done)
        step = end
    finally:
        bar.close()
        if manager is not None:
            manager.close()
    return TrainResult(model=nnx.merge(graphdef, params), step=step, history=history,
                       resumed_from=resumed_from)
