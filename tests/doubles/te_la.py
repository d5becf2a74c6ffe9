"""A contract double of TransformerEngine 2.20.2's linear-attention modules (``transformer_engine.pytorch``:
``GatedDeltaNetAttention``, ``GatedDeltaNet2Attention``, ``GatedDeltaProductAttention``), running on the cuDNN
frontend double (tests/doubles/cudnn_la.py) as the real modules run on the cuDNN op — so it computes with our
reference.

What it pins (TE 2.20.2 ``attention/linear_attention/{base,gdn,gdn2,gdp}.py``, see docs/libraries.md):

- the constructors: ``(num_attention_heads, kv_channels, qkv_format="sbhd", tp_size=1, tp_group=None,
  layer_number=None, scale=None)``, GDP with ``num_householder`` third; ``kv_channels`` an int or a
  ``(qk, v)`` tuple; scale ``1/sqrt(qk)`` by default; GDN2/GDP head sizes 64/128 only; GDP's num_householder
  an int >= 1; ``RuntimeError("TransformerEngine needs CUDA.")`` when torch sees no GPU (``make(cuda=False)``);
- the forwards, every flag keyword-only, and their checks in TE's order with TE's messages: missing gates,
  flag combinations, qkv_format in {thd, bshd, sbhd}, rank and token dimensions, heads (no GQA/GVA: q, k, v at
  num_attention_heads), head sizes, same dtype, fp16/bf16 only, gate dtypes and shapes, cu_seqlens (thd:
  required, int32 exactly; dense: refused), initial_state (float32 exactly, ``[B, H, V, K]``);
- the marshalling: sbhd -> batch-major THD (``transpose(0, 1)`` then flatten), bshd flattened, dense
  ``cu_seqlens = arange(B + 1) * S``; GDP's k, v, beta ``[tok..., n, H, ...]`` with the num_householder axis
  after the token dimensions, folded into expanded rows ``t*n + j``; the cuDNN op called with exactly TE's
  arguments (GDN: scale, initial_state, output_final_state, use_qk_l2norm_in_kernel; GDN2 adds the sigmoid,
  neg-eig and beta_guard; GDP adds safe_gate, gate_domain, a_log, dt_bias and num_householder);
- the output: ``[T, H*V]`` / ``[B, S, H*V]`` / ``[S, B, H*V]``; ``(output, final_state)`` only when
  ``output_final_state=True``, the output alone otherwise;
- ``checkpoint_core_attention=True``: TE's reentrant checkpoint — forward without a graph, the forward rerun
  inside the backward, gradients only for the positional tensors (a_log, dt_bias ride positionally in GDP),
  and ``RuntimeError("Checkpointing is not compatible with .grad(), ...")`` under ``torch.autograd.grad``.

Deviations: CPU tensors are accepted (TE's ``prepare_forward`` raises on a CPU input; the CPU is where this
double runs), there is no NVTX range, and results are fp64 as the cuDNN double's. ``mod.calls`` records each
forward's arguments as the adapter passed them; ``mod.ops.calls`` each kernel call, recomputations included.
"""

from __future__ import annotations

import math
import types

import torch

from . import cudnn_la

VERSION = "2.20.2"
_FORMATS = {"thd", "bshd", "sbhd"}


class _ReentrantCheckpoint(torch.autograd.Function):
    """TE's ``distributed.checkpoint`` (reentrant, the default): run without a graph, rerun in the backward."""

    @staticmethod
    def forward(ctx, run, kwargs, *args):
        ctx.run, ctx.kwargs, ctx.inputs = run, kwargs, args
        ctx.save_for_backward(*(a if torch.is_tensor(a) else None for a in args))
        with torch.no_grad():
            return run(*args, **kwargs)

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("Checkpointing is not compatible with .grad(), please use .backward() if possible")
        inputs = [t if t is not None else a for t, a in zip(ctx.saved_tensors, ctx.inputs)]
        inputs = [x.detach().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in inputs]
        with torch.enable_grad():
            outputs = ctx.run(*inputs, **ctx.kwargs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad and g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *(x.grad if torch.is_tensor(x) else None for x in inputs))


def _to_thd(x, qkv_format):
    if qkv_format == "thd":
        return x
    if qkv_format == "sbhd":
        x = x.transpose(0, 1)
    return x.reshape(-1, *x.shape[2:])


def _record(mod, module, call, positional) -> None:
    """Append one forward call as the adapter made it: the positional tensors and every keyword."""
    call = {k: v for k, v in call.items() if k != "self"}
    mod.calls.append({"module": module.module_name, "args": tuple(call.pop(n) for n in positional), "kwargs": call})


def make(*, cuda=True, ops=None, version=VERSION):
    """A fresh double of ``transformer_engine.pytorch``; ``ops`` is the cuDNN double underneath (default: new)."""
    mod = types.ModuleType("transformer_engine_pytorch_double")
    mod.__version__ = version
    mod.ops = ops if ops is not None else cudnn_la.make()
    mod.calls = []

    class _LinearAttention(torch.nn.Module):
        variant = module_name = ""
        head_dims = None  # GDN2/GDP: (64, 128)

        def __init__(self, num_attention_heads, kv_channels, qkv_format="sbhd", tp_size=1, tp_group=None,
                     layer_number=None, scale=None):
            super().__init__()
            if not cuda:
                raise RuntimeError("TransformerEngine needs CUDA.")
            self.qkv_format, self.tp_size = qkv_format, tp_size
            if tp_size <= 0:
                raise ValueError(f"tp_size must be positive, got {tp_size}.")
            if num_attention_heads % tp_size != 0:
                raise ValueError(f"num_attention_heads ({num_attention_heads}) must be divisible by tp_size ({tp_size}).")
            self.heads = num_attention_heads // tp_size
            self.qk_head_dim = kv_channels if isinstance(kv_channels, int) else kv_channels[0]
            self.v_head_dim = kv_channels if isinstance(kv_channels, int) else kv_channels[1]
            self.scale = 1.0 / math.sqrt(self.qk_head_dim) if scale is None else scale
            self.num_householder = 1
            self._dense_cu_seqlens = None

        def _check_head_dims(self):
            for name, dim in (("query/key head size", self.qk_head_dim), ("value head size", self.v_head_dim)):
                if dim not in self.head_dims:
                    raise ValueError(f"{self.module_name} {name} must be one of {self.head_dims}, got {dim}. "
                                     "kv_channels sets both; pass a tuple to size them separately.")

        # --- the module's forward: record, then (optionally checkpointed) the kernel adapter
        def _dispatch(self, forward_args, forward_kwargs, checkpoint_core_attention):
            if checkpoint_core_attention and torch.is_grad_enabled():
                return _ReentrantCheckpoint.apply(self._kernel, forward_kwargs, *forward_args)
            return self._kernel(*forward_args, **forward_kwargs)

        # --- the kernel adapter's shared checks (base.py _run)
        def _validate_head_geometry(self, q, v):
            if q.shape[-2] != self.heads:
                raise ValueError(f"{self.variant} Q and K must have {self.heads} heads, got {q.shape[-2]}.")
            if v.shape[-2] != self.heads:
                raise ValueError(f"{self.variant} V must have {self.heads} heads, got {v.shape[-2]}. "
                                 f"{self.module_name} requires its output width to match num_attention_heads * v_head_dim.")
            if q.shape[-1] != self.qk_head_dim:
                raise ValueError(f"{self.variant} Q and K head dimension must match kv_channels; expected "
                                 f"{self.qk_head_dim}, got {q.shape[-1]}.")
            if v.shape[-1] != self.v_head_dim:
                raise ValueError(f"{self.variant} V head dimension must match kv_channels; expected "
                                 f"{self.v_head_dim}, got {v.shape[-1]}.")

        def _validate_qkv_shapes(self, q, k, v, qkv_format):  # GDN / GDN2: one K/V row per token
            rank = 3 if qkv_format == "thd" else 4
            if any(t.dim() != rank for t in (q, k, v)):
                raise ValueError(f"Q, K, and V must be {rank}D tensors for qkv_format={qkv_format!r}.")
            if q.shape != k.shape:
                raise ValueError(f"{self.variant} requires Q and K to have the same shape; got "
                                 f"{tuple(q.shape)} and {tuple(k.shape)}.")
            if q.shape[:-2] != v.shape[:-2]:
                raise ValueError(f"{self.variant} requires Q, K, and V to have the same token dimensions.")
            self._validate_head_geometry(q, v)

        def _cu_seqlens(self, q, qkv_format, cu_seqlens):
            if qkv_format == "thd":
                if cu_seqlens is None:
                    raise ValueError(f"cu_seqlens is required for {self.variant} with qkv_format='thd'.")
                if cu_seqlens.dim() != 1:
                    raise ValueError("cu_seqlens must have shape [batch_size + 1].")
                if cu_seqlens.numel() < 2:
                    raise ValueError("cu_seqlens must contain at least a start and end offset.")
                if cu_seqlens.dtype != torch.int32:
                    raise TypeError(f"cu_seqlens must have dtype torch.int32, got {cu_seqlens.dtype}.")
                return cu_seqlens, None
            if cu_seqlens is not None:
                raise ValueError(f"Dense {self.variant} inputs do not accept cu_seqlens. "
                                 "Use qkv_format='thd' for packed or ragged batches.")
            batch, seq = q.shape[:2] if qkv_format == "bshd" else (q.shape[1], q.shape[0])
            return torch.arange(batch + 1, dtype=torch.int32, device=q.device) * seq, seq

        def _run(self, q, k, v, gates, initial_state, *, qkv_format, cu_seqlens, output_final_state, **kernel_kwargs):
            if qkv_format not in _FORMATS:
                raise ValueError(f"{self.variant} attention only supports qkv_format={{'thd', 'bshd', 'sbhd'}}, "
                                 f"got {qkv_format!r}.")
            if not all(torch.is_tensor(t) for t in (q, k, v, *gates.values())):
                raise TypeError(f"{self.variant} Q, K, V, and the gates ({', '.join(gates)}) must be torch.Tensor "
                                "instances.")
            self._validate_qkv_shapes(q, k, v, qkv_format)
            if any(t.device != q.device for t in (k, v, *gates.values())):
                raise ValueError(f"Q, K, V, and the gates ({', '.join(gates)}) must be on the same CUDA device.")
            if not q.dtype == k.dtype == v.dtype:
                raise TypeError(f"Q, K, and V must have the same dtype for {self.variant} attention.")
            if q.dtype not in (torch.float16, torch.bfloat16):
                raise TypeError(f"{self.variant} Q, K, and V must have dtype float16 or bfloat16 (no cuDNN frontend "
                                f"{self.variant} engine supports float32 inputs), got {q.dtype}.")
            self._validate_gates(gates, q)
            cu_seqlens, seq = self._cu_seqlens(q, qkv_format, cu_seqlens)
            batch = cu_seqlens.shape[0] - 1
            if initial_state is not None:
                if initial_state.dtype != torch.float32:
                    raise TypeError(f"{self.variant} initial_state must have dtype torch.float32, got "
                                    f"{initial_state.dtype}.")
                want = (batch, self.heads, self.v_head_dim, self.qk_head_dim)
                if tuple(initial_state.shape) != want:
                    raise ValueError(f"{self.variant} initial_state must have shape {want}, got "
                                     f"{tuple(initial_state.shape)}.")
            output, final_state = self._call_op(
                _to_thd(q, qkv_format), _to_thd(k, qkv_format), _to_thd(v, qkv_format),
                {n: _to_thd(t, qkv_format) for n, t in gates.items()}, cu_seqlens,
                initial_state=initial_state, output_final_state=output_final_state, **kernel_kwargs)
            if qkv_format == "thd":
                output = output.reshape(output.shape[0], -1)
            else:
                output = output.reshape(batch, seq, -1)
                if qkv_format == "sbhd":
                    output = output.transpose(0, 1).contiguous()
            return (output, final_state) if output_final_state else output

    class GatedDeltaNetAttention(_LinearAttention):
        variant, module_name = "GDN", "GatedDeltaNetAttention"

        def _validate_gates(self, gates, q):
            g, beta = gates["g"], gates["beta"]
            if g.dtype != torch.float32 or beta.dtype != torch.float32:
                raise TypeError("GDN g and beta must have dtype torch.float32 (the kernel-native dtype).")
            want = (*q.shape[:-2], self.heads)
            if g.shape != want or beta.shape != want:
                raise ValueError(f"GDN g and beta must both have shape {want}; got {tuple(g.shape)} and {tuple(beta.shape)}.")

        def _call_op(self, q, k, v, gates, cu_seqlens, *, initial_state, output_final_state, use_qk_l2norm_in_kernel=False):
            return mod.ops.gated_delta_net(q, k, v, gates["g"], gates["beta"], cu_seqlens, scale=self.scale,
                                           initial_state=initial_state, output_final_state=output_final_state,
                                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

        def _kernel(self, q, k, v, g, beta, initial_state=None, *, qkv_format, **kwargs):
            return self._run(q, k, v, {"g": g, "beta": beta}, initial_state, qkv_format=qkv_format, **kwargs)

        def forward(self, query_layer, key_layer, value_layer, g=None, beta=None, *, qkv_format=None, cu_seqlens=None,
                    checkpoint_core_attention=False, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False):
            _record(mod, self, locals(), ('query_layer', 'key_layer', 'value_layer', 'g', 'beta'))
            if g is None or beta is None:
                raise ValueError(f"GatedDeltaNetAttention requires both g and beta; got g={'set' if g is not None else 'None'} "
                                 f"and beta={'set' if beta is not None else 'None'}.")
            kwargs = {"qkv_format": qkv_format if qkv_format is not None else self.qkv_format, "cu_seqlens": cu_seqlens,
                      "output_final_state": output_final_state, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}
            return self._dispatch((query_layer, key_layer, value_layer, g, beta, initial_state), kwargs,
                                  checkpoint_core_attention)

    class GatedDeltaNet2Attention(_LinearAttention):
        variant, module_name, head_dims = "GDN2", "GatedDeltaNet2Attention", (64, 128)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._check_head_dims()

        def _validate_gates(self, gates, q):
            g, beta, w = gates["g"], gates["beta"], gates["w"]
            if g.dtype not in (torch.float32, q.dtype):
                raise TypeError(f"GDN2 g must have dtype torch.float32 or the Q/K/V dtype ({q.dtype}), got {g.dtype}.")
            if beta.dtype != q.dtype or w.dtype != q.dtype:
                raise TypeError(f"GDN2 beta and w must have the same dtype as Q, K, and V ({q.dtype}), got "
                                f"{beta.dtype} and {w.dtype}.")
            key_gate, value_gate = (*q.shape[:-2], self.heads, self.qk_head_dim), (*q.shape[:-2], self.heads, self.v_head_dim)
            if g.shape != key_gate or beta.shape != key_gate:
                raise ValueError(f"GDN2 g and beta must both have shape {key_gate} (one value per query/key channel); "
                                 f"got {tuple(g.shape)} and {tuple(beta.shape)}.")
            if w.shape != value_gate:
                raise ValueError(f"GDN2 w must have shape {value_gate} (one value per value channel); got {tuple(w.shape)}.")

        def _call_op(self, q, k, v, gates, cu_seqlens, *, initial_state, output_final_state, use_qk_l2norm_in_kernel=False,
                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, beta_guard=False):
            return mod.ops.gated_delta_net_v2(
                q, k, v, gates["g"], gates["beta"], gates["w"], cu_seqlens, scale=self.scale, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                beta_guard=beta_guard)

        def _kernel(self, q, k, v, g, beta, w, initial_state=None, *, qkv_format, **kwargs):
            return self._run(q, k, v, {"g": g, "beta": beta, "w": w}, initial_state, qkv_format=qkv_format, **kwargs)

        def forward(self, query_layer, key_layer, value_layer, g=None, beta=None, w=None, *, qkv_format=None,
                    cu_seqlens=None, checkpoint_core_attention=False, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                    beta_guard=False):
            _record(mod, self, locals(), ('query_layer', 'key_layer', 'value_layer', 'g', 'beta', 'w'))
            missing = [n for n, t in (("g", g), ("beta", beta), ("w", w)) if t is None]
            if missing:
                raise ValueError(f"GatedDeltaNet2Attention requires all of g, beta, and w; got no {', '.join(missing)}.")
            if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
                raise ValueError("GatedDeltaNet2Attention allow_neg_eigval requires use_beta_sigmoid_in_kernel, "
                                 "which owns the sigmoid it scales.")
            if beta_guard and not use_qk_l2norm_in_kernel:
                raise ValueError("GatedDeltaNet2Attention beta_guard requires use_qk_l2norm_in_kernel; the guard is "
                                 "defined on the normalized key.")
            kwargs = {"qkv_format": qkv_format if qkv_format is not None else self.qkv_format, "cu_seqlens": cu_seqlens,
                      "output_final_state": output_final_state, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
                      "use_beta_sigmoid_in_kernel": use_beta_sigmoid_in_kernel, "allow_neg_eigval": allow_neg_eigval,
                      "beta_guard": beta_guard}
            return self._dispatch((query_layer, key_layer, value_layer, g, beta, w, initial_state), kwargs,
                                  checkpoint_core_attention)

    mod.GatedDeltaNetAttention = GatedDeltaNetAttention
    mod.GatedDeltaNet2Attention = GatedDeltaNet2Attention
    mod.GatedDeltaProductAttention = _gdp_class(mod, _LinearAttention)
    return mod


def _gdp_class(mod, base):
    """``GatedDeltaProductAttention``: k, v, beta on the expanded timeline, the num_householder axis explicit."""

    class GatedDeltaProductAttention(base):
        variant, module_name, head_dims = "GDP", "GatedDeltaProductAttention", (64, 128)

        def __init__(self, num_attention_heads, kv_channels, num_householder=1, qkv_format="sbhd", tp_size=1,
                     tp_group=None, layer_number=None, scale=None):
            super().__init__(num_attention_heads, kv_channels, qkv_format=qkv_format, tp_size=tp_size,
                             tp_group=tp_group, layer_number=layer_number, scale=scale)
            if not isinstance(num_householder, int) or isinstance(num_householder, bool):
                raise TypeError(f"GatedDeltaProductAttention num_householder must be an int, got "
                                f"{type(num_householder).__name__}.")
            if num_householder < 1:
                raise ValueError(f"GatedDeltaProductAttention num_householder must be positive, got {num_householder}.")
            self.num_householder = num_householder
            self._check_head_dims()

        def _validate_qkv_shapes(self, q, k, v, qkv_format):
            tok = 1 if qkv_format == "thd" else 2
            if q.dim() != tok + 2:
                raise ValueError(f"GDP Q must be a {tok + 2}D tensor for qkv_format={qkv_format!r}, got {tuple(q.shape)}.")
            for name, t in (("K", k), ("V", v)):
                if t.dim() != tok + 3:
                    raise ValueError(f"GDP {name} must be a {tok + 3}D tensor for qkv_format={qkv_format!r}: Q's token "
                                     f"dimensions, then a num_householder axis, then [heads, head_dim]. Got {tuple(t.shape)}.")
                if tuple(t.shape[:tok]) != tuple(q.shape[:tok]):
                    raise ValueError(f"GDP requires Q and {name} to have the same token dimensions; got "
                                     f"{tuple(q.shape[:tok])} and {tuple(t.shape[:tok])}.")
                if t.shape[tok] != self.num_householder:
                    raise ValueError(f"GDP {name} must carry {self.num_householder} sub-token rows per token in its "
                                     f"num_householder axis (dimension {tok}), got {t.shape[tok]}.")
            if k.shape[-2:] != q.shape[-2:]:
                raise ValueError(f"GDP requires Q and K to have the same heads and head dimension; got "
                                 f"{tuple(q.shape[-2:])} and {tuple(k.shape[-2:])}.")
            self._validate_head_geometry(q, v)

        def _validate_gates(self, gates, q):
            for name, gate in gates.items():
                if gate.dtype not in (torch.float32, q.dtype):
                    raise TypeError(f"GDP {name} must have dtype torch.float32 or the Q/K/V dtype ({q.dtype}), got {gate.dtype}.")
            decay, write = (*q.shape[:-2], self.heads), (*q.shape[:-2], self.num_householder, self.heads)
            if gates["g"].shape != decay:
                raise ValueError(f"GDP g must have shape {decay} (one decay per token and head); got {tuple(gates['g'].shape)}.")
            if gates["beta"].shape != write:
                raise ValueError(f"GDP beta must have shape {write} (one write strength per sub-token and head); got "
                                 f"{tuple(gates['beta'].shape)}.")

        def _call_op(self, q, k, v, gates, cu_seqlens, *, initial_state, output_final_state, **flags):
            k, v, beta = (t.reshape(-1, *t.shape[2:]) for t in (k, v, gates["beta"]))
            return mod.ops.gated_delta_product(q, k, v, gates["g"], beta, cu_seqlens, self.num_householder,
                                               scale=self.scale, initial_state=initial_state,
                                               output_final_state=output_final_state, **flags)

        def _kernel(self, q, k, v, g, beta, initial_state=None, a_log=None, dt_bias=None, *, qkv_format, **kwargs):
            for name, t in (("a_log", a_log), ("dt_bias", dt_bias)):
                if t is not None and t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise TypeError(f"GDP {name} must have dtype torch.float32, torch.bfloat16 or torch.float16, got {t.dtype}.")
                if t is not None and tuple(t.shape) != (self.heads,):
                    raise ValueError(f"GDP {name} must have shape {(self.heads,)} (one value per head); got {tuple(t.shape)}.")
            return self._run(q, k, v, {"g": g, "beta": beta}, initial_state, qkv_format=qkv_format, a_log=a_log,
                             dt_bias=dt_bias, **kwargs)

        def forward(self, query_layer, key_layer, value_layer, g=None, beta=None, *, qkv_format=None, cu_seqlens=None,
                    checkpoint_core_attention=False, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                    safe_gate=False, gate_domain="log", a_log=None, dt_bias=None):
            _record(mod, self, locals(), ('query_layer', 'key_layer', 'value_layer', 'g', 'beta'))
            if g is None or beta is None:
                raise ValueError(f"GatedDeltaProductAttention requires both g and beta; got g={'set' if g is not None else 'None'} "
                                 f"and beta={'set' if beta is not None else 'None'}.")
            if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
                raise ValueError("GatedDeltaProductAttention allow_neg_eigval requires use_beta_sigmoid_in_kernel, "
                                 "which owns the sigmoid it scales.")
            if gate_domain not in ("log", "linear"):
                raise ValueError(f"GatedDeltaProductAttention gate_domain must be 'log' or 'linear', got {gate_domain!r}.")
            if safe_gate and gate_domain == "linear":
                raise ValueError("GatedDeltaProductAttention safe_gate cannot combine with gate_domain='linear'; the "
                                 "safe gate already maps its logits to a log decay.")
            passed = [n for n, t in (("a_log", a_log), ("dt_bias", dt_bias)) if t is not None]
            if not safe_gate and passed:
                raise ValueError(f"GatedDeltaProductAttention {' and '.join(passed)} may only be passed with "
                                 "safe_gate=True; they parameterize the safe-gate transform and have no meaning without it.")
            kwargs = {"qkv_format": qkv_format if qkv_format is not None else self.qkv_format, "cu_seqlens": cu_seqlens,
                      "output_final_state": output_final_state, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
                      "use_beta_sigmoid_in_kernel": use_beta_sigmoid_in_kernel, "allow_neg_eigval": allow_neg_eigval,
                      "safe_gate": safe_gate, "gate_domain": gate_domain}
            # a_log and dt_bias travel positionally: the reentrant checkpoint only differentiates positional tensors.
            return self._dispatch((query_layer, key_layer, value_layer, g, beta, initial_state, a_log, dt_bias), kwargs,
                                  checkpoint_core_attention)

    return GatedDeltaProductAttention
