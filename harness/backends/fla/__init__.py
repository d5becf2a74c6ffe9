"""The flash-linear-attention backends (``fla``: chunked kernels with autograd; ``fla-recurrent``: the
forward-only recurrent kernels): ``adapter.py`` marshals and calls them, ``facts.py`` holds our floors and the
entry points. Importing this package never imports FLA."""

from ..base import register
from .adapter import DISPATCH_ENV, FlaBackend
from .facts import CHUNK, INSTALL_HINT, RECURRENT

__all__ = ["CHUNK", "DISPATCH_ENV", "INSTALL_HINT", "RECURRENT", "FlaBackend"]


@register("fla")
def _fla() -> FlaBackend:
    return FlaBackend()


@register("fla-recurrent")
def _fla_recurrent() -> FlaBackend:
    return FlaBackend(recurrent=True)
