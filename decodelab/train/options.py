"""How a training run runs, apart from what it optimises: where its checkpoints go and what they
hold, whether it continues them, where it stops early and whether it shows progress (the
run-control arguments of ``trainer.train``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from decodelab.checks import check_bool, check_int
from decodelab.convert.tokenizer import PretrainedTokenizer
from decodelab.text.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The run-control arguments of ``train.train`` (``train`` says what each does), checked
    here; each ValueError names the field. ``stop_after`` is checked against the run's steps by
    ``train``."""

    checkpoint_dir: str | os.PathLike | None = None  # None: no checkpoints
    # Stored with every checkpoint: needed with checkpoint_dir.
    tokenizer: Tokenizer | PretrainedTokenizer | None = None
    resume: bool = False  # continue from the latest checkpoint in checkpoint_dir
    stop_after: int | None = None  # end the run at this step, as an interruption would
    progress: bool = True  # show a progress bar
    extra_meta: Mapping[str, Any] | None = None  # more fields of every checkpoint's metadata

    def __post_init__(self) -> None:
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir,
                                                              (str, os.PathLike)):
            raise ValueError(f"checkpoint_dir must be None or a path, got "
                             f"{self.checkpoint_dir!r}")
        if self.checkpoint_dir is not None and self.tokenizer is None:
            raise ValueError("tokenizer must be given with checkpoint_dir (checkpoints embed it)")
        check_bool("resume", self.resume)
        check_bool("progress", self.progress)
        if self.stop_after is not None:
            check_int("stop_after", self.stop_after, 1)
        if self.extra_meta is not None and not (
                isinstance(self.extra_meta, Mapping)
                and all(isinstance(k, str) for k in self.extra_meta)):
            raise ValueError(f"extra_meta must be None or a dict with str keys, got "
                             f"{self.extra_meta!r}")
