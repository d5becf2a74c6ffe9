"""The TransformerEngine backends (``te``: the linear-attention modules called plainly; ``te-checkpoint``: the
same with ``checkpoint_core_attention=True``): ``adapter.py`` constructs and calls the modules, ``facts.py`` holds
our floors, the entry points and what each module can express. Importing this package never imports TE."""

from ..base import register
from .adapter import TeBackend
from .facts import ENTRY_POINTS, INSTALL_HINT

__all__ = ["ENTRY_POINTS", "INSTALL_HINT", "TeBackend"]


@register("te")
def _te() -> TeBackend:
    return TeBackend()


@register("te-checkpoint")
def _te_checkpoint() -> TeBackend:
    return TeBackend(checkpoint=True)
