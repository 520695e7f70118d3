"""refengine: a compact continuous-batching reference engine with vLLM's public surface."""
from refengine.engine import LLMEngine
from refengine.llm import LLM
from refengine.outputs import CompletionOutput, RequestOutput
from refengine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]
