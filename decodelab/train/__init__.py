"""Training: the loop (``trainer``), distillation and Orbax checkpoints."""

from decodelab.train.checkpoint import load_checkpoint, save_checkpoint
from decodelab.train.distill import KLToTeacher
from decodelab.train.trainer import TrainConfig, TrainingDiverged, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "TrainingDiverged", "KLToTeacher", "load_checkpoint",
           "save_checkpoint", "train"]
