"""Incoming gradients in cuDNN's own layout, contiguous.

The adapter turns cuDNN's value-major final state ``[N, HO, V, K]`` key-major with a transpose, and a bhsd/sbhd
output back to the case's layout the same way. Autograd then hands FE's backward the transpose of our
(contiguous) gradient: a strided ``d_final_state`` / ``d_out``, which FE 1.32's cuTile engines refuse at execute
(``ValueError: GdnCuTileEngine: buffer for 'd_final_state' must be contiguous``, H200, 2026-12-02). A user who
stays in cuDNN's layout hands it contiguous gradients, so that is what the judged backward gets; the refusal
itself is a finding recorded in docs/libraries.md, not something every backward case should trip over.
"""

from __future__ import annotations

import torch


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; the backward passes its incoming gradient on as a contiguous tensor."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def contiguous_grad(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged, except that whatever gradient reaches it flows on to cuDNN contiguous."""
    return _ContiguousGrad.apply(x) if x.requires_grad else x
