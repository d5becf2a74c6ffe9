"""Pure-PyTorch reference math for the gated delta-rule family. Imports torch only.

``gdn``, ``kda``, ``gdn2`` and ``gdp`` mirror ``cudnn.linear_attention``'s ops; ``layouts`` converts among
thd / bshd / sbhd / bhsd and state orientations; ``token_oracle`` is the token-by-token core; ``serving`` is the
serving path (state pools, decode steps, state series, speculative verification: docs/serving.md).
"""

from . import layouts, serving
from .layouts import ReferenceInputError
from .ops import gdn, gdn2, gdp, head_index, kda
from .oracle import token_oracle

__all__ = ["gdn", "kda", "gdn2", "gdp", "layouts", "serving", "token_oracle", "head_index", "ReferenceInputError"]
