"""Distillation: train a model to match a fixed teacher's next-token distributions.

DistillSpec (Zhou et al., 2024) distils the draft of speculative decoding from its target: a draft
that imitates the target's distributions, rather than the data's, agrees with the target more often,
so more of its proposals are accepted. ``KLToTeacher`` is that objective on the training stream (the
corpus windows ``train`` uses; DistillSpec also studies on-policy data, drafts of the student's own,
which this does not): at every position of every window, the KL divergence from the teacher's
next-token distribution to the student's (forward KL), both at temperature ``temperature``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.checks import check_number
from decodelab.config import ModelConfig
from decodelab.model import Transformer
from decodelab.train import trainer as train


@dataclasses.dataclass(frozen=True, eq=False)
class KLToTeacher(train.Objective):
    """Mean over positions of ``KL(teacher || student)`` of the next-token distributions."""

    # The fixed teacher; its weights reach the compiled step as arguments (``aux``).
    teacher: Transformer
    # What identifies the teacher's weights (e.g. its cache key in a workdir): checkpoints record
    # it, so a run is never resumed against another teacher.
    teacher_id: str
    # Both distributions are softmax(logits / temperature).
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.teacher, Transformer):
            raise ValueError(f"teacher must be a Transformer, got {type(self.teacher).__name__}")
        if not isinstance(self.teacher_id, str) or not self.teacher_id:
            raise ValueError(f"teacher_id must be a non-empty string, got {self.teacher_id!r}")
        check_number("temperature", self.temperature, 0, open_low=True)

    def aux(self) -> Any:
        return nnx.state(self.teacher)

    def loss(self, model, windows, aux):
        inputs = windows[:, :-1]  # [B, T]
        teacher = nnx.merge(nnx.graphdef(self.teacher), aux)
        log_p = jax.nn.log_softmax(jax.lax.stop_gradient(teacher(inputs)) / self.temperature)
        log_q = jax.nn.log_softmax(model(inputs) / self.temperature)  # [B, T, V]
        return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1).mean()

    def to_dict(self) -> dict[str, Any]:
        return {"name": "kl_to_teacher", "teacher": self.teacher_id,
                "temperature": float(self.temperature)}


def distill(teacher: Transformer, teacher_id: str, student_cfg: ModelConfig,
            tc: train.TrainConfig, train_stream: np.ndarray, *, temperature: float = 1.0,
            **train_kwargs) -> train.TrainResult:
    """``train.train`` of a ``student_cfg`` model with ``KLToTeacher(teacher, teacher_id,
    temperature)`` as the objective; ``train_kwargs`` as for ``train.train`` (``run``: its
    checkpoints, resume, progress). The student must share the teacher's vocabulary."""
    if student_cfg.vocab_size != teacher.config.vocab_size:
        raise ValueError(f"student_cfg.vocab_size must equal the teacher's "
                         f"{teacher.config.vocab_size}, got {student_cfg.vocab_size}")
    objective = KLToTeacher(teacher, teacher_id, temperature)
    return train.train(student_cfg, tc, train_stream, objective=objective, **train_kwargs)
