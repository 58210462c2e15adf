"""The decodelab Transformer and its parts."""

from decodelab.model.parts import split
from decodelab.model.positions import POSITION_ENCODINGS, PositionEncoding
from decodelab.model.transformer import (Transformer, abstract_transformer, param_count,
                                         with_config)

__all__ = ["POSITION_ENCODINGS", "PositionEncoding", "Transformer", "abstract_transformer",
           "param_count", "split", "with_config"]
