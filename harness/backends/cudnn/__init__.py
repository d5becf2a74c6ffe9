"""The cuDNN frontend backends: ``cudnn`` (cuDNN's own routing) and one ``cudnn@<engine>`` per engine, pinned
(facts.ENGINES). ``adapter.py`` marshals and calls the ops, ``facts.py`` holds our floors and the entry points.
Importing this package never imports cuDNN."""

from ..base import register
from .adapter import PLAN_ENV, CudnnBackend, CudnnEngineBackend
from .facts import ENGINES, ENTRY_POINTS, INSTALL_HINT, engine_backend

__all__ = ["ENGINES", "ENTRY_POINTS", "INSTALL_HINT", "PLAN_ENV", "CudnnBackend", "CudnnEngineBackend"]


@register("cudnn")
def _cudnn() -> CudnnBackend:
    return CudnnBackend()


def _pinned(engine: str):
    return lambda: CudnnEngineBackend(engine)


for _engine in ENGINES:  # cudnn@gdn_cutile, cudnn@kda_hopper, ...: one backend per engine, pinned
    register(engine_backend(_engine))(_pinned(_engine))
