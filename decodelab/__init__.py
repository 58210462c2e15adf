"""decodelab: a JAX/XLA research framework for LLM decoding experiments."""

# Configuration
# Model and cache
from decodelab.cache import Kivi, KiviKVCache, KVCache, QuantizedKVCache, init_cache

# Sampling and decoding
from decodelab.checks import set_memory_limit
from decodelab.compress.pruning import prune, prune_heads, prune_neurons
from decodelab.compress.quantization import parameter_bytes, quantize
from decodelab.config import ModelConfig

# Real checkpoints (GGUF files, Hugging Face directories)
from decodelab.convert import PretrainedTokenizer, load_gguf, load_hf
from decodelab.decode.beam import BeamSearchOutput, beam_search
from decodelab.decode.contrastive import contrastive_search
from decodelab.decode.generation import generate
from decodelab.decode.output import GenerateOutput
from decodelab.decode.request import BeamOptions, DecodeOptions

# Compression: weights and KV caches stored quantized, weights pruned, judged on one scoreboard
from decodelab.measure.scoreboard import Scoreboard, compare
from decodelab.model import Transformer, param_count
from decodelab.sampling.params import SamplingParams

# Scale: data and tensor parallel on a device mesh
from decodelab.sharding import make_mesh, shard
from decodelab.speculative.generation import (NgramDrafter, SpeculativeOptions, SpeculativeOutput,
                                              speculative_generate)

# Text: tokenizer
from decodelab.text.tokenizer import Tokenizer

# Training and checkpoints
from decodelab.train.checkpoint import load_checkpoint, save_checkpoint
from decodelab.train.trainer import TrainConfig  # the loop itself: decodelab.train.trainer.train

__all__ = [
    "KVCache",
    "ModelConfig",
    "Tokenizer",
    "TrainConfig",
    "Transformer",
    "load_checkpoint",
    "load_gguf",
    "load_hf",
    "PretrainedTokenizer",
    "param_count",
    "parameter_bytes",
    "quantize",
    "prune",
    "prune_heads",
    "prune_neurons",
    "QuantizedKVCache",
    "Kivi",
    "KiviKVCache",
    "init_cache",
    "Scoreboard",
    "compare",
    "save_checkpoint",
    # Sampling and decoding
    "GenerateOutput",
    "SamplingParams",
    "DecodeOptions",
    "generate",
    "BeamOptions",
    "BeamSearchOutput",
    "beam_search",
    "contrastive_search",
    "NgramDrafter",
    "SpeculativeOptions",
    "SpeculativeOutput",
    "speculative_generate",
    "set_memory_limit",
    # Scale
    "make_mesh",
    "shard",
]
