"""The cases issue #27 appends to the tiers (cases/added.py): counted per op and envelope, and every case
generated before them kept as it was."""

from __future__ import annotations

import pytest

from deltacheck.cases import added
from deltacheck.cases import matrix as matrix_module
from deltacheck.cases.support import OP_SUPPORT
from deltacheck.harness.ci.tiers import target_envelopes, tier_cases


def _minimal_counts():
    l0 = tier_cases("L0")
    counts = {}
    for envelope in target_envelopes():
        for layout in added.MINIMAL_LAYOUTS:
            for h0 in (False, True):
                counts[(envelope.name, layout, h0)] = sum(
                    1 for c in l0 if c.layout == layout and c.initial_state == h0 and added.is_minimal_np2(c)
                    and envelope.contains(c))
    return counts


def test_every_envelope_has_thd_and_bshd_minimal_flag_cases_at_a_non_power_of_two_head_dim_in_l0():
    """Per op and envelope: thd and bshd, with and without h0, K = V = 96, log gate, no in-kernel flag. Where a count
    is 0 the envelope serves no such case at all (the reason is checked, not assumed)."""
    missing = []
    for (name, layout, h0), n in _minimal_counts().items():
        if n:
            continue
        envelope = next(e for e in target_envelopes() if e.name == name)
        candidates = added._minimal_candidates(envelope.op, layout, h0, "L0")
        if layout not in OP_SUPPORT[envelope.op].layouts or not any(envelope.contains(c) for c in candidates):
            continue  # e.g. cuDNN's Hopper KDA engine: K = V = 128 only; GDP: packed thd only
        missing.append((name, layout, h0))
    assert not missing, missing
    served = {(name, layout, h0) for (name, layout, h0), n in _minimal_counts().items() if n}
    # FLA's three ops serve K = 96: each of their 4 slots is filled. cuDNN FE 1.32's engines serve no
    # non-power-of-two head dim (their envelopes: 64 and 128 only), so they have none to fill.
    for envelope in target_envelopes():
        if envelope.name.startswith("cudnn"):
            assert "96x96" not in envelope.axes()["dims"], envelope.name
    for name in ("fla gdn", "fla kda", "fla gdn2"):
        for layout in ("thd", "bshd"):
            for h0 in (False, True):
                assert (name, layout, h0) in served, (name, layout, h0)


def test_the_minimal_check_sees_every_flag():
    base = next(c for c in tier_cases("L0") if added.is_minimal_np2(c))
    for change in ({"l2norm": True}, {"beta_sigmoid": True}, {"safe_gate": True}, {"scale": 0.5},
                   {"gate_domain": "linear"}, {"K": 64, "V": 64}):
        assert not added.is_minimal_np2(base.replace(**change)), change


@pytest.mark.parametrize("tier,min_tokens", [("L0", 256), ("L1", 2048)])
def test_safe_gate_backward_on_multi_chunk_sequences_for_kda_and_gdn2(tier, min_tokens):
    cases = tier_cases(tier)
    for op in ("kda", "gdn2"):
        for io in ("fp16", "bf16"):
            for gate in ("typical", "steep"):
                hits = [c for c in cases if c.op == op and c.io_dtype == io and c.gate == gate and c.safe_gate
                        and c.backward and max(c.seqlens) >= (256 if tier == "L0" else min_tokens)]
                assert hits, (tier, op, io, gate)


def test_the_added_cases_come_last_and_leave_every_earlier_case_as_it_was(monkeypatch):
    envelopes = target_envelopes()
    full = tier_cases("L0")  # the generator over these envelopes, as it runs (read from the suite's tier cache)
    monkeypatch.setattr(added, "minimal_dims_cases", lambda *a, **k: [])
    monkeypatch.setattr(added, "safe_gate_backward_cases", lambda *a, **k: [])
    monkeypatch.setattr(added, "guard_separation_cases", lambda *a, **k: [])
    before = matrix_module.tier_cases("L0", envelopes)
    assert full[:len(before)] == before and len(full) > len(before)
