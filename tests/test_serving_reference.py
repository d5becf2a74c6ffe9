"""The serving reference (reference/serving.py): pools, decode chains, state series, checkpoints, speculative
verification, and the pool comparison catching a key-major read of a value-major pool."""

from __future__ import annotations

import pytest
import torch

from deltacheck.reference import ReferenceInputError, gdn, gdn2, gdp, kda
from deltacheck.reference import serving as sv

F64 = torch.float64
EXACT = 1e-12
OPS = {"gdn": gdn, "kda": kda, "gdn2": gdn2, "gdp": gdp}
NH = 2  # GDP's sub-tokens per token


def make(op: str, T: int, *, H=2, HV=2, K=4, V=3, seed=0):
    """Token-wise inputs (fp64, packed) and op keywords; decays in (-0.6, 0], l2-normalized keys, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    HO = max(H, HV)
    sub = NH if op == "gdp" else 1

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    def unit(*shape):
        return torch.rand(*shape, generator=gen, dtype=F64)

    k = torch.nn.functional.normalize(r(T * sub, H, K), dim=-1)
    q, v = r(T, H, K), r(T * sub, HV, V)
    gfeat = (K,) if op in ("kda", "gdn2") else ()
    g = -0.6 * unit(T, HO, *gfeat)
    beta = unit(T * sub, HO, *((K,) if op == "gdn2" else ()))
    tensors = [q, k, v, g, beta]
    if op == "gdn2":
        tensors.append(unit(T, HO, V))
    kw = {"num_householder": NH} if op == "gdp" else {}
    return tuple(tensors), kw


def cu(lengths):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths).cumsum(0)
    return out


def pool_of(n_pool, HO=2, V=3, K=4, seed=1):
    return torch.randn(n_pool, HO, V, K, generator=torch.Generator().manual_seed(seed), dtype=F64)


def seq(op, tensors, a, b):
    """Sequence [a, b) of packed tensors (GDP's sub-token tensors by their sub-token rows)."""
    sub = NH if op == "gdp" else 1
    return tuple(x[a * sub:b * sub] if (op == "gdp" and i in (1, 2, 4)) else x[a:b] for i, x in enumerate(tensors))


def direct(op, tensors, kw, lengths, h0s):
    """Per-sequence reference calls: (outputs concatenated, final states stacked)."""
    outs, finals, a = [], [], 0
    for L, h0 in zip(lengths, h0s):
        o, f = OPS[op](*seq(op, tensors, a, a + L), cu([L]), initial_state=h0, output_final_state=True, **kw)
        outs.append(o)
        finals.append(f[0])
        a += L
    return torch.cat(outs), torch.stack(finals)


def close(a, b, tol=EXACT):
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


# --- pool in -> pool out ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_pool_rows_equal_direct_calls_and_others_are_untouched(op):
    lengths = [3, 1, 4]
    tensors, kw = make(op, sum(lengths))
    pool = pool_of(7)
    idx = torch.tensor([5, 0, 3], dtype=torch.int32)
    got = sv.pooled(op, pool, idx, *tensors, cu_seqlens=cu(lengths), **kw)
    out, finals = direct(op, tensors, kw, lengths, [pool[i:i + 1] for i in idx.tolist()])
    assert close(got.out, out)
    assert got.written == (5, 0, 3) and got.null == (False, False, False)
    for n, i in enumerate(idx.tolist()):
        assert close(got.pool[i], finals[n])
    for r in (1, 2, 4, 6):
        assert torch.equal(got.pool[r], pool[r])
    cmp = sv.compare_pool(got.pool, got.pool, pool, got.written, atol=0, rtol=EXACT)
    assert cmp.ok


def test_pooled_accepts_the_function_or_its_name():
    tensors, kw = make("gdn", 4)
    pool, idx = pool_of(3), torch.tensor([2, 1], dtype=torch.int32)
    a = sv.pooled(gdn, pool, idx, *tensors, cu_seqlens=cu([1, 3]))
    b = sv.pooled("gdn", pool, idx, *tensors, cu_seqlens=cu([1, 3]))
    assert torch.equal(a.pool, b.pool) and torch.equal(a.out, b.out)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_vllm_null_slot_starts_from_zero_and_writes_nothing(op):
    lengths = [2, 3, 2]
    tensors, kw = make(op, sum(lengths), seed=3)
    pool = pool_of(6)
    idx = torch.tensor([4, 0, -3], dtype=torch.int32)  # ids <= 0 are null under vLLM's convention
    got = sv.pooled(op, pool, idx, *tensors, cu_seqlens=cu(lengths), null_slot=sv.VLLM, **kw)
    assert got.null == (False, True, True) and got.written == (4,)
    zero = torch.zeros_like(pool[:1])
    out, finals = direct(op, tensors, kw, lengths, [pool[4:5], zero, zero])
    assert close(got.out, out)
    assert close(got.pool[4], finals[0])
    for r in (0, 1, 2, 3, 5):
        assert torch.equal(got.pool[r], pool[r])


def test_sglang_padding_is_minus_one_and_zero_is_a_real_row():
    lengths = [2, 2]
    tensors, kw = make("gdn", 4, seed=4)
    pool = pool_of(3)
    got = sv.pooled("gdn", pool, torch.tensor([0, -1]), *tensors, cu_seqlens=cu(lengths), null_slot=sv.SGLANG)
    assert got.null == (False, True) and got.written == (0,)
    assert not torch.equal(got.pool[0], pool[0])
    assert torch.equal(got.pool[1:], pool[1:])


@pytest.mark.parametrize("idx, null_slot, words", [
    ([0, 7], None, "out of range"),
    ([-1, 2], None, "out of range"),
    ([-2, 2], sv.SGLANG, "out of range"),
    ([3, 9], sv.VLLM, "out of range"),
    ([2, 2], None, "repeats"),
    ([4, 4], sv.VLLM, "repeats"),
])
def test_bad_indices_are_clear_input_errors(idx, null_slot, words):
    tensors, _ = make("gdn", 4)
    with pytest.raises(ReferenceInputError, match=words):
        sv.pooled("gdn", pool_of(7), torch.tensor(idx), *tensors, cu_seqlens=cu([2, 2]), null_slot=null_slot)


def test_repeated_null_indices_are_fine_and_float_indices_refused():
    tensors, _ = make("gdn", 4)
    got = sv.pooled("gdn", pool_of(3), torch.tensor([0, 0]), *tensors, cu_seqlens=cu([2, 2]), null_slot=sv.VLLM)
    assert got.written == ()
    with pytest.raises(ReferenceInputError, match="integer"):
        sv.pooled("gdn", pool_of(3), torch.tensor([0.0, 1.0]), *tensors, cu_seqlens=cu([2, 2]))
    with pytest.raises(ReferenceInputError, match="N=2"):
        sv.pooled("gdn", pool_of(3), torch.tensor([0]), *tensors, cu_seqlens=cu([2, 2]))


# --- decode -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_decode_chain_equals_one_prefill(op):
    N, steps = 3, 5
    tensors, kw = make(op, N * steps, seed=5)
    pool = pool_of(8)
    idx = torch.tensor([6, 0, 2], dtype=torch.int32)  # permuted, pool larger than the batch, one null (vLLM)
    chain = sv.decode_chain(op, pool, idx, *tensors, steps=steps, null_slot=sv.VLLM, **kw)
    prefill = sv.pooled(op, pool, idx, *tensors, cu_seqlens=cu([steps] * N), null_slot=sv.VLLM, **kw)
    real = torch.tensor([not z for z in chain.null for _ in range(steps)])
    assert close(chain.out[real], prefill.out[real]) and close(chain.pool, prefill.pool)
    assert chain.written == prefill.written == (6, 2)
    assert torch.equal(chain.pool[0], pool[0])
    # a null sequence keeps no state between steps: every step starts it from zeros again (not the prefill)
    rows = torch.arange(steps * 1, steps * 2)
    alone, _ = direct(op, tuple(x for x in seq(op, tensors, steps, 2 * steps)), kw, [1] * steps,
                      [None] * steps)
    assert close(chain.out[rows], alone)
    assert not close(chain.out[rows], prefill.out[rows], tol=1e-6)


def test_decode_step_is_one_token_per_sequence():
    tensors, _ = make("gdn", 4, seed=6)
    pool = pool_of(5)
    idx = torch.tensor([3, 1, 4, 0])
    got = sv.decode_step("gdn", pool, idx, *tensors)
    out, finals = direct("gdn", tensors, {}, [1, 1, 1, 1], [pool[i:i + 1] for i in idx.tolist()])
    assert close(got.out, out) and close(got.pool[idx], finals)


def test_decode_chain_catches_a_state_not_carried_between_steps():
    """A chain that restarts every step from the input pool is not the prefill: the comparison can fail."""
    N, steps = 2, 3
    tensors, _ = make("gdn", N * steps, seed=7)
    pool, idx = pool_of(4), torch.tensor([1, 3])
    prefill = sv.pooled("gdn", pool, idx, *tensors, cu_seqlens=cu([steps] * N))
    rows = torch.arange(N) * steps
    stale = sv.decode_step("gdn", pool, idx, *(x.index_select(0, rows + steps - 1) for x in tensors))
    assert not close(stale.pool, prefill.pool, tol=1e-6)


# --- state series and checkpoints ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_state_series_ends_at_the_final_state(op):
    lengths = [4, 0, 3]
    tensors, kw = make(op, sum(lengths), seed=8)
    h0 = pool_of(3, seed=9)
    series = sv.state_series(op, *tensors, cu_seqlens=cu(lengths), initial_state=h0, **kw)
    _, final = OPS[op](*tensors, cu(lengths), initial_state=h0, output_final_state=True, **kw)
    assert [s.shape[0] for s in series] == [L + 1 for L in lengths]
    for n, s in enumerate(series):
        assert torch.equal(s[0], h0[n])
        assert close(s[-1], final[n])
    # every prefix: the state after p tokens of sequence 0 is a call over its first p tokens
    for p in range(1, lengths[0] + 1):
        _, f = OPS[op](*seq(op, tensors, 0, p), cu([p]), initial_state=h0[:1], output_final_state=True, **kw)
        assert close(series[0][p], f[0])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("every", [1, 2, 3])
def test_checkpoints_are_the_series_every_n_tokens_strictly_before_the_end(op, every):
    lengths = [5, 1, 0, 6]
    tensors, kw = make(op, sum(lengths), seed=10)
    h0 = pool_of(4, seed=11)
    every_n = every * (NH if op == "gdp" else 1)  # cuDNN counts GDP's sub-tokens
    ck = sv.checkpoints(op, *tensors, every_n=every_n, cu_seqlens=cu(lengths), initial_state=h0, **kw)
    rows = sv.checkpoint_rows(cu(lengths), every_n, NH if op == "gdp" else 1)
    assert [c for _, c in rows] == [-(-L // every) for L in lengths]  # ceil(L / N) per sequence, 0 when empty
    assert ck.shape[0] == sum(c for _, c in rows) <= sum(lengths) * (NH if op == "gdp" else 1) // every_n + len(lengths)
    series = sv.state_series(op, *tensors, cu_seqlens=cu(lengths), initial_state=h0, **kw)
    for n, (start, count) in enumerate(rows):
        want = series[n][0:lengths[n]:every]  # p = 0, N, 2N, ... < L: the initial state included, the final not
        assert want.shape[0] == count
        assert close(ck[start:start + count], want) if count else True
        if count:
            assert torch.equal(ck[start], h0[n])


def test_gdp_checkpoint_inside_a_token_is_refused():
    tensors, kw = make("gdp", 4)
    with pytest.raises(ReferenceInputError, match="multiple of num_householder"):
        sv.checkpoints("gdp", *tensors, every_n=3, cu_seqlens=cu([4]), **kw)


def test_checkpoints_catch_an_off_by_one_cadence():
    """The state after p+1 tokens is not the checkpoint at p: the comparison can fail."""
    tensors, kw = make("kda", 6, seed=12)
    ck = sv.checkpoints("kda", *tensors, every_n=2, cu_seqlens=cu([6]))
    series = sv.state_series("kda", *tensors, cu_seqlens=cu([6]))[0]
    assert not close(ck, series[1:6:2], tol=1e-6)


# --- speculative verification -----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_spec_verify_per_token_states_and_every_accepted_count(op):
    N, k = 3, 3
    T = k + 1  # the last verified token and k drafts
    tensors, kw = make(op, N * T, seed=13)
    nxt, _ = make(op, N * T, seed=14)
    pool = pool_of(16)
    table = torch.tensor([[5, 9, 2, 14], [11, 3, 7, 1], [8, 15, 4, 12]], dtype=torch.int32)
    lengths = [T] * N
    first = sv.spec_verify(op, pool, table, *tensors, cu_seqlens=cu(lengths),
                           num_accepted_tokens=torch.ones(N, dtype=torch.int32), **kw)
    h0 = pool[table[:, 0].long()]
    series = sv.state_series(op, *tensors, cu_seqlens=cu(lengths), initial_state=h0, **kw)
    out, _ = direct(op, tensors, kw, lengths, [h0[n:n + 1] for n in range(N)])
    assert close(first.out, out)
    for n in range(N):
        for t in range(T):
            assert close(first.pool[table[n, t]], series[n][t + 1])  # slot [n, t] holds the state after token t
    assert sorted(first.written) == sorted(table.reshape(-1).tolist())
    untouched = [r for r in range(16) if r not in table.reshape(-1).tolist()]
    assert torch.equal(first.pool[untouched], pool[untouched])
    for accepted in range(k + 1):  # accepted drafts 0..k: num_accepted_tokens = accepted + 1
        acc = torch.full((N,), accepted + 1, dtype=torch.int32)
        picked = sv.picked_state(first.pool, table, acc)
        prefix = torch.stack([  # one prefill over each sequence's accepted prefix
            OPS[op](*seq(op, tensors, n * T, n * T + accepted + 1), cu([accepted + 1]), initial_state=h0[n:n + 1],
                    output_final_state=True, **kw)[1][0] for n in range(N)])
        assert close(picked, prefix)
        if accepted:  # the first block instead of the accepted one is a different state
            assert not close(first.pool[table[:, 0].long()], prefix, tol=1e-6)
        second = sv.spec_verify(op, first.pool, table, *nxt, cu_seqlens=cu(lengths), num_accepted_tokens=acc, **kw)
        want, _ = direct(op, nxt, kw, lengths, [picked[n:n + 1] for n in range(N)])
        assert close(second.out, want)


def test_spec_verify_null_start_slot_skips_the_sequence():
    tensors, _ = make("gdn", 4, seed=15)
    pool = pool_of(6)
    table = torch.tensor([[0, 3], [4, 5]])
    got = sv.spec_verify("gdn", pool, table, *tensors, cu_seqlens=cu([2, 2]))
    assert got.null == (True, False) and sorted(got.written) == [4, 5]
    assert torch.equal(got.pool[:4], pool[:4])
    zero_out, _ = gdn(*(x[:2] for x in tensors), cu([2]), initial_state=torch.zeros_like(pool[:1]))
    assert close(got.out[:2], zero_out)


@pytest.mark.parametrize("table, acc, words", [
    ([[1, 2], [3, 2]], [1, 1], "repeats"),
    ([[1, 2], [3, 4]], [0, 1], "must lie in"),
    ([[1, 2], [3, 4]], [1, 3], "must lie in"),
    ([[1, 2], [3, 6]], [1, 1], "out of range"),
])
def test_spec_verify_bad_tables_are_input_errors(table, acc, words):
    tensors, _ = make("gdn", 4)
    with pytest.raises(ReferenceInputError, match=words):
        sv.spec_verify("gdn", pool_of(6), torch.tensor(table), *tensors, cu_seqlens=cu([2, 2]),
                       num_accepted_tokens=torch.tensor(acc))


def test_spec_verify_row_shorter_than_its_sequence_is_refused():
    tensors, _ = make("gdn", 4)
    with pytest.raises(ReferenceInputError, match="2 slots"):
        sv.spec_verify("gdn", pool_of(6), torch.tensor([[1, 2], [3, 4]]), *tensors, cu_seqlens=cu([3, 1]))


# --- pool comparison: planted bugs ----------------------------------------------------------------------------------

def _kernel_double(pool, idx, tensors, lengths, *, key_major=False, stray_write=None):
    """A fake fused kernel writing into its pool in place (fp32 pool): optionally reading and writing the value-major
    pool key-major (S^T, the shape agrees only when K == V), optionally writing one stray row."""
    pool = pool.clone()
    h0 = pool[idx.long()].to(F64)
    if key_major:
        h0 = h0.transpose(-1, -2)
    _, final = gdn(*tensors, cu(lengths), initial_state=h0, output_final_state=True)
    if key_major:
        final = final.transpose(-1, -2)
    pool[idx.long()] = final.to(pool.dtype)
    if stray_write is not None:
        pool[stray_write] = 0
    return pool


@pytest.mark.parametrize("bug", [None, "key_major", "stray_write"])
def test_compare_pool_catches_a_key_major_read_and_a_stray_write(bug):
    K = V = 4
    lengths = [2, 3]
    tensors, _ = make("gdn", sum(lengths), K=K, V=V, seed=16)
    before = pool_of(5, V=V, K=K).to(torch.float32)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    ref = sv.pooled("gdn", before, idx, *tensors, cu_seqlens=cu(lengths))
    actual = _kernel_double(before, idx, tensors, lengths, key_major=bug == "key_major",
                            stray_write=4 if bug == "stray_write" else None)
    cmp = sv.compare_pool(actual, ref.pool, before, ref.written, atol=1e-6, rtol=1e-5)
    if bug is None:
        assert cmp.ok and cmp.addressed_err <= 1.0
    elif bug == "key_major":
        assert not cmp.ok and cmp.bad_rows == (1, 3) and cmp.changed_rows == ()
    else:
        assert not cmp.ok and cmp.bad_rows == () and cmp.changed_rows == (4,)


def test_written_rows_and_the_key_major_pool_orientation():
    assert sv.written_rows(torch.tensor([[0, 3], [-1, 2]]), sv.VLLM) == [3, 2]
    assert sv.written_rows(torch.tensor([0, -1]), sv.SGLANG) == [0]
    tensors, _ = make("gdn", 5, seed=17)
    pool, idx = pool_of(4), torch.tensor([2, 0])
    vk = sv.pooled("gdn", pool, idx, *tensors, cu_seqlens=cu([2, 3]))
    kv = sv.pooled("gdn", pool.transpose(-1, -2).contiguous(), idx, *tensors, cu_seqlens=cu([2, 3]), state_layout="kv")
    assert torch.equal(kv.pool.transpose(-1, -2), vk.pool) and torch.equal(kv.out, vk.out)


def test_compare_pool_untouched_rows_are_bitwise():
    before = pool_of(3).to(torch.float32)
    actual = before.clone()
    actual[2, 0, 0, 0] = torch.nextafter(actual[2, 0, 0, 0], torch.tensor(float("inf")))
    cmp = sv.compare_pool(actual, before.to(F64), before, [], atol=1.0, rtol=1.0)
    assert cmp.changed_rows == (2,)
