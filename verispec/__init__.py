"""verispec: lossless speculative decoding for causal LMs on PyTorch."""
from verispec.api import Chunk, Engine, Result
from verispec.config import Grammar, SamplingParams, SpecConfig

__version__ = "0.1.0"
__all__ = ["Chunk", "Engine", "Grammar", "Result", "SamplingParams", "SpecConfig", "__version__"]
