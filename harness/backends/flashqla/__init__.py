"""The FlashQLA backend (``flashqla``: Qwen's fused TileLang GDN forward and backward): ``adapter.py`` marshals
and calls it, ``facts.py`` holds our floors, the entry point and the envelope. Importing this package never
imports FlashQLA or TileLang."""

from ..base import register
from .adapter import FlashQlaBackend
from .facts import INSTALL_HINT

__all__ = ["INSTALL_HINT", "FlashQlaBackend"]


@register("flashqla")
def _flashqla() -> FlashQlaBackend:
    return FlashQlaBackend()
