"""The FlashInfer backends (``flashinfer``: SM90 GDN prefill; ``flashinfer-decode``: SM90 GDN decode, one token per
call), both forward only. ``adapter.py`` marshals and calls them, ``facts.py`` holds our floors and envelopes.
Importing this package never imports FlashInfer."""

from ..base import register
from .adapter import FlashInferBackend

__all__ = ["FlashInferBackend"]


@register("flashinfer")
def _flashinfer() -> FlashInferBackend:
    return FlashInferBackend()


@register("flashinfer-decode")
def _flashinfer_decode() -> FlashInferBackend:
    return FlashInferBackend(decode=True)
