"""Models: load a spec (hub id, local folder, .gguf, embedded default) and run it (batched scoring with
shared-prefix KV reuse, generation with logits processors)."""

from promptopt.models.api import ModelRunner
from promptopt.models.load import EMBEDDED_DEFAULT, LoadedModel, ModelConfig, load_model
from promptopt.models.runner import GenerationResult, LoglikelihoodResult, Runner

__all__ = [
    "EMBEDDED_DEFAULT",
    "GenerationResult",
    "LoadedModel",
    "LoglikelihoodResult",
    "ModelConfig",
    "ModelRunner",
    "Runner",
    "load_model",
]
