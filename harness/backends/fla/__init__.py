"""The flash-linear-attention backends (``fla``: chunked kernels with autograd; ``fla-recurrent``: the
forward-only recurrent kernels; ``fla-dispatch``: FLA with its backend dispatch on, the served implementation
recorded per result; ``fla-dispatch-cp``: that under inference mode with intra-card CP): ``adapter.py`` and
``dispatch.py`` marshal and call them, ``facts.py`` holds our floors and the entry points. Importing this package
never imports FLA."""

from ..base import register
from .adapter import DISPATCH_ENV, FlaBackend
from .dispatch import FlaDispatchBackend
from .facts import CHUNK, INSTALL_HINT, RECURRENT

__all__ = ["CHUNK", "DISPATCH_ENV", "INSTALL_HINT", "RECURRENT", "FlaBackend", "FlaDispatchBackend"]


@register("fla")
def _fla() -> FlaBackend:
    return FlaBackend()


@register("fla-recurrent")
def _fla_recurrent() -> FlaBackend:
    return FlaBackend(recurrent=True)


@register("fla-dispatch")
def _fla_dispatch() -> FlaDispatchBackend:
    return FlaDispatchBackend()


@register("fla-dispatch-cp")
def _fla_dispatch_cp() -> FlaDispatchBackend:
    return FlaDispatchBackend(inference_cp=True)
