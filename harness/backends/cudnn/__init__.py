"""The cuDNN frontend backend (``cudnn``): ``adapter.py`` marshals and calls the ops, ``facts.py`` holds our
floors and the entry points. Importing this package never imports cuDNN."""

from ..base import register
from .adapter import PLAN_ENV, CudnnBackend
from .facts import ENTRY_POINTS, INSTALL_HINT

__all__ = ["ENTRY_POINTS", "INSTALL_HINT", "PLAN_ENV", "CudnnBackend"]


@register("cudnn")
def _cudnn() -> CudnnBackend:
    return CudnnBackend()
