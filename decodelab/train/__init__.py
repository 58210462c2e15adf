"""Training: the loop (``trainer``), distillation (``distill``: the module, whose function is
``distill.distill``) and Orbax checkpoints."""

from decodelab.train.checkpoint import load_checkpoint, save_checkpoint
from decodelab.train.distill import KLToTeacher
from decodelab.train.options import RunOptions
from decodelab.train.trainer import TrainConfig, TrainingDiverged, TrainResult, train

__all__ = ["KLToTeacher", "RunOptions", "TrainConfig", "TrainResult", "TrainingDiverged",
           "load_checkpoint", "save_checkpoint", "train"]
