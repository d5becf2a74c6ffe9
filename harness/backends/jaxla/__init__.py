"""The jax-linear-attention backend (``jax``: jla's Pallas Mosaic GPU kernels on SM90, called through DLPack,
gradients by ``jax.vjp``). ``adapter.py`` marshals, ``bridge.py`` hands tensors between torch and JAX,
``facts.py`` holds our floors and envelopes. Importing this package never imports JAX.

cuDNN FE 1.32's JAX API (``cudnn/linear_attention/jax_api.py``) is not a second spec here: it serves KDA on
SM100/SM103 only (``target_device`` raises NotImplementedError elsewhere), so on the SM90 machines this adapter
targets it could only ever decline (docs/libraries.md)."""

from ..base import register
from .adapter import JaxBackend

__all__ = ["JaxBackend"]


@register("jax")
def _jax() -> JaxBackend:
    return JaxBackend()
