"""Compression: weights stored quantized (``quantization``, with the layers in ``qlinear``) and
pruned (``pruning``, its patterns in ``patterns``).

A transform applied to a model some transform already made never returns it unchanged and never
mixes kinds: it composes, redoes the work from the recovered float weights with a warning, or
raises a ValueError that says what the model is and what to do. Rows: what the model already is;
columns: the transform asked for.

=================  ====================  ==========  ===================================
model already is   ``quantize``          ``prune``   ``prune_heads`` / ``prune_neurons``
=================  ====================  ==========  ===================================
float              quantized             zeros       smaller
quantized (1)      redone, warning (2)   ValueError  ValueError (3)
pruned (zeros)     quantized (4)         (5)         smaller
smaller            quantized             zeros       smaller again
sharded            kept on the model's mesh, by its rules (``sharding.place_like``) (6)
=================  ====================  ==========  ===================================

(1) By ``quantize`` (any ``weights``, ``method``, ``activations``) or
``load_gguf(dequantize=False)``. (2) ``quantize(dequantized(model), ...)`` with a warning that
says so: every projection holds the new kind, none the old (``int8`` bytes never stay in an
"int4" model), and the layers get the default block size. (3) The message says to use the
float model and quantize afterwards, or ``dequantized(model)``. (4) Absmax keeps a pruned zero
exactly 0. (5) Composes: old zeros stay and the request is met, so a higher sparsity or another
pattern prunes further; a ValueError when a projection already holds more zeros than asked
(they cannot come back), a warning when some comparison groups do. (6) ``shard`` warns when the
mesh's ``model`` axis holds quantized projections whole (its rules split float kernels).

``dequantized`` of a float model is a copy (it is what was asked); ``with_block_elements``,
``mask_heads``, ``mask_neurons``, ``update_mask`` and the importances refuse what they cannot
act on (a float model; a quantized one). ``shard`` of a sharded model lays it out afresh;
``decodelab.sharding`` states it. Weights stored as 16-bit floats (``quantize(model,
weights="bfloat16" | "float16")``, ``ModelConfig.param_dtype``) count as quantized in this table:
quantized again from float32 with a warning, refused by ``prune``, back to float32 through
``dequantized``.
"""

from decodelab.compress.pruning import prune, prune_heads, prune_neurons, update_mask
from decodelab.compress.qlinear import QuantizedEinsum, QuantizedEmbed, QuantizedWeights
from decodelab.compress.quantization import dequantized, describe, parameter_bytes, quantize

__all__ = ["QuantizedEinsum", "QuantizedEmbed", "QuantizedWeights", "dequantized", "describe",
           "parameter_bytes", "prune", "prune_heads", "prune_neurons", "quantize", "update_mask"]
