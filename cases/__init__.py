"""What to test: the Case spec, the per-op support declaration, the generated tiers, deterministic inputs.

Imports torch (for inputs) and nothing from reference/, harness/ or reports/.
"""

from .axes import MAIN_AXES, axis_values
from .coverage import coverage_table, interaction_coverage, pair_coverage
from .inputs import make_inputs, make_weights, stream_seed, tensor_digest
from .kexpr import KExprError, compile_k
from .matrix import TIER_AXES, TIER_BUDGETS, select, tier_cases
from .spec import BETA_PROFILES, GATE_PROFILES, IO_DTYPES, LAYOUTS, STATE_DTYPES, TIERS, Case, CaseError, parse_id
from .support import OP_SUPPORT, OpSupport

__all__ = [
    "BETA_PROFILES", "GATE_PROFILES", "IO_DTYPES", "LAYOUTS", "MAIN_AXES", "OP_SUPPORT", "STATE_DTYPES",
    "TIERS", "TIER_AXES", "TIER_BUDGETS", "interaction_coverage", "Case", "CaseError", "KExprError", "OpSupport", "axis_values", "compile_k",
    "coverage_table", "make_inputs", "make_weights", "pair_coverage", "parse_id", "select",
    "stream_seed", "tensor_digest", "tier_cases",
]
