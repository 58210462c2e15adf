"""Compression: weights stored quantized (``quantization``, with the layers in ``qlinear``) and
pruned (``pruning``)."""

from decodelab.compress.pruning import prune, prune_heads, prune_neurons, update_mask
from decodelab.compress.qlinear import QuantizedEinsum, QuantizedEmbed, QuantizedWeights
from decodelab.compress.quantization import dequantized, describe, parameter_bytes, quantize

__all__ = ["QuantizedEinsum", "QuantizedEmbed", "QuantizedWeights", "dequantized", "describe",
           "parameter_bytes", "prune", "prune_heads", "prune_neurons", "quantize", "update_mask"]
