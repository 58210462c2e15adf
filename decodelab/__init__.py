"""decodelab: a JAX/XLA research framework for LLM decoding experiments."""

# Configuration
from decodelab.config import ModelConfig

# Text: tokenizer
from decodelab.tokenizer import Tokenizer

# Model and cache
from decodelab.cache import KVCache
from decodelab.model import Transformer, param_count

# Real checkpoints (GGUF files, Hugging Face directories)
from decodelab.convert import PretrainedTokenizer, load_gguf, load_hf

# Compression: weights and KV caches stored quantized, weights pruned, judged on one scoreboard
from decodelab.compare import Scoreboard, compare
from decodelab.prune import prune, prune_heads, prune_neurons
from decodelab.kvquant import Kivi, KiviKVCache, QuantizedKVCache, init_cache
from decodelab.quantize import parameter_bytes, quantize

# Training and checkpoints
from decodelab.checkpoint import load_checkpoint, save_checkpoint
from decodelab.train import TrainConfig  # the loop itself: decodelab.train.train

# Sampling and decoding
from decodelab.checks import set_memory_limit
from decodelab.request import GenerateOutput
from decodelab.decode import generate
from decodelab.sampling import SamplingParams
from decodelab.beam import BeamSearchOutput, beam_search
from decodelab.speculative import NgramDrafter, SpeculativeOutput, speculative_generate

# Scale: data and tensor parallel on a device mesh
from decodelab.sharding import make_mesh, shard

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
    "generate",
    "BeamSearchOutput",
    "beam_search",
    "NgramDrafter",
    "SpeculativeOutput",
    "speculative_generate",
    "set_memory_limit",
    # Scale
    "make_mesh",
    "shard",
]
