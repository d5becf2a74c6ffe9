"""deltacheck: reference-vs-fused numerical verification for gated delta-rule linear attention.

Layout (data flows left to right; a module never imports from a folder to its right):
``cases`` -> ``reference`` / ``harness.backends`` -> ``harness.compare`` -> ``reports``.
"""

__version__ = "0.1.0"
