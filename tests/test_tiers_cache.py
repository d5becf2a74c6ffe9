"""The generated tiers kept on disk (harness/ci/tiers.py): what is read back is exactly what the generator makes, the
key moves with what the generation reads, and a torn or foreign file is never trusted."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from deltacheck.harness.ci import tiers


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tiers.TIER_CACHE_ENV, str(tmp_path))
    tiers._tier.cache_clear()
    yield tmp_path
    tiers._tier.cache_clear()


def generated(tier):
    """The generator's output, bypassing every cache: the truth the cached tiers are compared with."""
    return list(_generated(tier))


@functools.cache  # one generation per tier serves the module: nothing here changes the generator
def _generated(tier):
    return tuple(tiers.generated_tier(tier, tiers.target_envelopes()))


def test_a_tier_read_back_is_the_generated_one_case_for_case(cache):
    first = tiers.tier_cases("L0")  # generates and writes
    (path,) = cache.glob("L0-*.ids")
    tiers._tier.cache_clear()
    again = tiers.tier_cases("L0")  # reads
    fresh = generated("L0")
    assert again == first == fresh
    assert [dataclasses.astuple(c) for c in again] == [dataclasses.astuple(c) for c in fresh]
    assert path.read_text().splitlines()[-1] == "end"


def test_the_key_moves_with_the_envelopes_and_the_tier(cache):
    envelopes = tiers.target_envelopes()
    base = tiers.tier_cache_file("L0", envelopes)
    assert base == tiers.tier_cache_file("L0", tiers.target_envelopes())  # the same in every call
    assert tiers.tier_cache_file("L2", envelopes) != base
    assert tiers.tier_cache_file("L0", envelopes[:-1]) != base
    changed = [dataclasses.replace(envelopes[0], name=envelopes[0].name + " (edited)"), *envelopes[1:]]
    assert tiers.tier_cache_file("L0", changed) != base


@pytest.mark.parametrize("content", ["", "gdn-bf16-thd-N1-T[5]-H1/1/1-K64-V64-typical\n",
                                     "not a case id\nend\n"], ids=["empty", "torn", "foreign"])
def test_a_torn_or_foreign_file_is_regenerated(cache, content):
    path = tiers.tier_cache_file("L2", tiers.target_envelopes())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    assert tiers.tier_cases("L2") == generated("L2")
    assert path.read_text().splitlines()[-1] == "end"  # and rewritten whole


def test_a_planted_file_is_what_a_run_would_read_so_the_key_must_hold_everything(cache):
    """The check above can fail: a whole file under the right key is trusted as it is."""
    path = tiers.tier_cache_file("L2", tiers.target_envelopes())
    path.parent.mkdir(parents=True, exist_ok=True)
    one = generated("L2")[0]
    path.write_text(f"{one.id}\nend\n")
    assert tiers.tier_cases("L2") == [one]


def test_zero_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(tiers.TIER_CACHE_ENV, "0")
    monkeypatch.setenv("DELTACHECK_CACHE_DIR", str(tmp_path))
    tiers._tier.cache_clear()
    try:
        assert tiers.tier_cache_file("L2", tiers.target_envelopes()) is None
        assert tiers.tier_cases("L2") == generated("L2")
        assert not list(tmp_path.rglob("*.ids"))
    finally:
        tiers._tier.cache_clear()


def test_without_a_home_directory_the_tiers_are_generated_without_the_cache(monkeypatch):
    """Path.home() raises when HOME is unset and the uid has no passwd entry (a container's --user): the cache is
    off then, never the reason a command fails."""
    monkeypatch.delenv(tiers.TIER_CACHE_ENV, raising=False)
    monkeypatch.delenv("DELTACHECK_CACHE_DIR", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(tiers, "cache_root", no_home)
    tiers._tier.cache_clear()
    try:
        assert tiers.tier_cache_file("L2", tiers.target_envelopes()) is None
        assert tiers.tier_cases("L2") == generated("L2")
    finally:
        tiers._tier.cache_clear()
