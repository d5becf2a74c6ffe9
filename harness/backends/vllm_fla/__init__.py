"""vLLM's bundled FLA copy (``vllm-fla``: chunk_gated_delta_rule; ``vllm-fla-recurrent``:
fused_recurrent_gated_delta_rule), forward only. Importing this package never imports vLLM."""

from ..base import register
from .adapter import VllmFlaBackend

__all__ = ["VllmFlaBackend"]


@register("vllm-fla")
def _vllm_fla() -> VllmFlaBackend:
    return VllmFlaBackend()


@register("vllm-fla-recurrent")
def _vllm_fla_recurrent() -> VllmFlaBackend:
    return VllmFlaBackend(recurrent=True)
