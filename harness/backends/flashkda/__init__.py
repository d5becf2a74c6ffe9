"""FlashKDA's forward (``flashkda``: the op vLLM ships; ``flashkda-tokenspeed``: the standalone wheel).
Importing this package never imports vLLM, FlashKDA or their binaries."""

from ..base import register
from .adapter import FlashKdaBackend
from .facts import STANDALONE, VLLM

__all__ = ["FlashKdaBackend"]


@register(VLLM)
def _flashkda() -> FlashKdaBackend:
    return FlashKdaBackend(VLLM)


@register(STANDALONE)
def _flashkda_tokenspeed() -> FlashKdaBackend:
    return FlashKdaBackend(STANDALONE)
