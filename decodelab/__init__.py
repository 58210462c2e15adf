"""decodelab: a JAX/XLA research framework for LLM decoding experiments."""

# Configuration
from decodelab.config import ModelConfig

# Model and cache
from decodelab.cache import KVCache
from decodelab.model import Transformer, param_count

__all__ = ["KVCache", "ModelConfig", "Transformer", "param_count"]
