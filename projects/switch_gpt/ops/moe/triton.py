"""The experts of a Switch layer as grouped GEMMs in Triton (the design of ScatterMoE, written from the idea).

The k choices of the N tokens are sorted by expert into R = N x k rows (dropped choices last, in no expert); row r
holds choice slot[r] (token slot[r] // k). Then, for each expert, one launch covers all experts:
    h   = x[slot // k] @ W1[e] + b1[e]                 gather fused into the load, rows in expert order
    out[slot] = gate * (gelu(h) @ W2[e] + b2[e])       scatter and router weight fused into the store
and the sum over a token's k slots. Backward: the input gradients are the same grouped GEMM with the weights
transposed (the gather and scatter swap roles), the weight gradients a grouped GEMM reducing over each expert's
rows, the bias and router-weight gradients segment sums in PyTorch. Tiles of BLOCK_M rows never straddle two
experts; their number is bounded by cdiv(R, BLOCK_M) + E, so no launch waits for the routing on the host.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from languini.triton_utils import interpreting
from projects.switch_gpt.ops.moe.naive import check_expert_inputs


@triton.heuristics({"HAS_BIAS": lambda args: args["bias_ptr"] is not None,
                    "HAS_SCALE": lambda args: args["scale_ptr"] is not None})
@triton.jit
def switch_gpt_moe_grouped_mm_kernel(
        out_ptr, inp_ptr, w_ptr, bias_ptr, scale_ptr, slot_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr,
        K, N, gather_div, stride_in, stride_out, stride_we, stride_wk, stride_wn,
        GATHER: tl.constexpr, SCATTER: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
        UPCAST: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[o(r)] = scale[r] * (inp[i(r)] @ W[e] + b[e]) for the rows r of one tile of expert e, where
    i(r) = slot[r] // gather_div if GATHER else r, and o(r) = slot[r] if SCATTER else r."""
    tile, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(tile_expert_ptr + tile)
    rows = tl.load(tile_row_ptr + tile) + tl.arange(0, BLOCK_M)
    row_mask = rows < tl.load(offsets_ptr + e + 1)  # tiles past the last expert's rows are empty
    if GATHER or SCATTER:
        slot = tl.load(slot_ptr + rows, mask=row_mask, other=0)
    in_rows = slot // gather_div if GATHER else rows
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        a = tl.load(inp_ptr + in_rows[:, None].to(tl.int64) * stride_in + ks[None, :],
                    mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptr + e.to(tl.int64) * stride_we + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=k_mask[:, None] & col_mask[None, :], other=0.0)
        if UPCAST:  # the interpreter's bf16 arithmetic is wrong
            a, w = a.to(tl.float32), w.to(tl.float32)
        if IEEE:
            acc += tl.dot(a, w, input_precision="ieee")
        else:
            acc += tl.dot(a, w)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e * N + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    out_rows = slot if SCATTER else rows
    tl.store(out_ptr + out_rows[:, None].to(tl.int64) * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.heuristics({"HAS_SCALE": lambda args: args["scale_ptr"] is not None})
@triton.jit
def switch_gpt_moe_weight_grad_kernel(
        dw_ptr, a_ptr, g_ptr, scale_ptr, slot_ptr, offsets_ptr, K, N, a_div, g_div, stride_a, stride_g,
        A_GATHER: tl.constexpr, G_GATHER: tl.constexpr, HAS_SCALE: tl.constexpr, UPCAST: tl.constexpr,
        IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """dW[e] = sum over the rows r of expert e of a[i(r)]^T (scale[r] g[j(r)]), with i(r) = slot[r] // a_div if
    A_GATHER else r, and j(r) = slot[r] // g_div if G_GATHER else r; an expert without rows gets zeros."""
    e, pid_k, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ks = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_mask, col_mask = ks < K, cols < N
    start, end = tl.load(offsets_ptr + e), tl.load(offsets_ptr + e + 1)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_mask = rows < end
        if A_GATHER or G_GATHER:
            slot = tl.load(slot_ptr + rows, mask=row_mask, other=0)
        a_rows = slot // a_div if A_GATHER else rows
        g_rows = slot // g_div if G_GATHER else rows
        a = tl.load(a_ptr + a_rows[:, None].to(tl.int64) * stride_a + ks[None, :],
                    mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        g = tl.load(g_ptr + g_rows[:, None].to(tl.int64) * stride_g + cols[None, :],
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        if HAS_SCALE:  # scaled in fp32, then back to the operands' dtype for the tensor cores
            g = (g.to(tl.float32) * tl.load(scale_ptr + rows, mask=row_mask, other=0.0)[:, None]).to(g.dtype)
        if UPCAST:
            a, g = a.to(tl.float32), g.to(tl.float32)
        if IEEE:
            acc += tl.dot(tl.trans(a), g, input_precision="ieee")
        else:
            acc += tl.dot(tl.trans(a), g)
    tl.store(dw_ptr + e.to(tl.int64) * K * N + ks[:, None] * N + cols[None, :], acc.to(dw_ptr.dtype.element_ty),
             mask=k_mask[:, None] & col_mask[None, :])


def _blocks(dtype: torch.dtype):
    """(BLOCK_M, BLOCK_N, BLOCK_K): tensor-core tiles, the same under the interpreter (which the compile check
    records)."""
    return (64, 64, 32) if dtype == torch.float32 else (64, 128, 64)


def _flags(dtype: torch.dtype) -> dict:
    return {"UPCAST": interpreting(), "IEEE": dtype == torch.float32}


def _tiles(offsets: torch.Tensor, rows: int, block_m: int):
    """Each tile's expert and first row: cdiv(rows, block_m) + E tiles, the ones past the experts' rows empty."""
    E = offsets.numel() - 1
    counts = offsets[1:] - offsets[:-1]
    per_expert = (counts + block_m - 1) // block_m
    ends = per_expert.cumsum(0)
    tile = torch.arange(triton.cdiv(rows, block_m) + E, device=offsets.device)
    expert = torch.searchsorted(ends, tile, right=True).clamp(max=E - 1)
    first = offsets[expert] + (tile - (ends[expert] - per_expert[expert])) * block_m
    return expert.to(torch.int32), first.to(torch.int32)


@torch.library.custom_op("switch_gpt::moe_grouped_mm", mutates_args=())
def _grouped_mm_op(inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
                   slot: torch.Tensor, offsets: torch.Tensor, gather_div: int, gather: bool, scatter: bool,
                   out_rows: int, out_dtype: torch.dtype) -> torch.Tensor:
    """The grouped GEMM; weight (E, K, N) with any strides (a transposed view is the backward's W^T)."""
    K, N = weight.shape[1], weight.shape[2]
    out = torch.zeros(out_rows, N, device=inp.device, dtype=out_dtype)  # rows no expert writes stay 0
    if slot.numel() == 0:  # no choices (no tokens): nothing to launch
        return out
    block_m, block_n, block_k = _blocks(inp.dtype)
    tile_expert, tile_row = _tiles(offsets, slot.numel(), block_m)
    grid = (tile_expert.numel(), triton.cdiv(N, block_n))
    switch_gpt_moe_grouped_mm_kernel[grid](
        out, inp, weight, bias, scale, slot, tile_expert, tile_row, offsets, K, N, gather_div, inp.stride(0),
        out.stride(0), weight.stride(0), weight.stride(1), weight.stride(2), GATHER=gather, SCATTER=scatter,
        **_flags(inp.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


@_grouped_mm_op.register_fake
def _(inp, weight, bias, scale, slot, offsets, gather_div, gather, scatter, out_rows, out_dtype):
    return inp.new_empty(out_rows, weight.shape[2], dtype=out_dtype)


@torch.library.custom_op("switch_gpt::moe_weight_grad", mutates_args=())
def _weight_grad_op(a: torch.Tensor, g: torch.Tensor, scale: torch.Tensor | None, slot: torch.Tensor,
                    offsets: torch.Tensor, a_div: int, g_div: int, a_gather: bool, g_gather: bool) -> torch.Tensor:
    """(E, K, N) float32: each expert's sum of a-row^T g-row over its rows."""
    E, K, N = offsets.numel() - 1, a.shape[1], g.shape[1]
    if slot.numel() == 0:  # no choices (no tokens): no expert has a gradient
        return torch.zeros(E, K, N, device=a.device, dtype=torch.float32)
    dw = torch.empty(E, K, N, device=a.device, dtype=torch.float32)
    block_m, block_n, block_k = _blocks(a.dtype)
    grid = (E, triton.cdiv(K, block_k), triton.cdiv(N, block_n))
    switch_gpt_moe_weight_grad_kernel[grid](
        dw, a, g, scale, slot, offsets, K, N, a_div, g_div, a.stride(0), g.stride(0), A_GATHER=a_gather,
        G_GATHER=g_gather, **_flags(a.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return dw


@_weight_grad_op.register_fake
def _(a, g, scale, slot, offsets, a_div, g_div, a_gather, g_gather):
    return a.new_empty(offsets.numel() - 1, a.shape[1], g.shape[1], dtype=torch.float32)


def _segment_sum(rows: torch.Tensor, key: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(E, width) float32: the sum of the rows of each expert (key E: dropped, left out)."""
    out = torch.zeros(n_experts + 1, rows.shape[1], device=rows.device, dtype=torch.float32)
    return out.index_add_(0, key, rows.float())[:n_experts]


class _GroupedExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gates, fc_weight, fc_bias, proj_weight, proj_bias, slot, key, offsets, k):
        N, R = x.shape[0], slot.numel()
        gate = gates.reshape(-1)[slot].float() * (key < fc_weight.shape[0])  # dropped rows weigh nothing
        h = _grouped_mm_op(x, fc_weight, fc_bias, None, slot, offsets, k, True, False, R, x.dtype)
        a = F.gelu(h, approximate="tanh")
        out = _grouped_mm_op(a, proj_weight, proj_bias, gate, slot, offsets, 1, False, True, R, torch.float32)
        ctx.save_for_backward(x, gates, fc_weight, proj_weight, proj_bias, slot, key, offsets, gate, h)
        ctx.k, ctx.bias_dtypes = k, (fc_bias.dtype, proj_bias.dtype)
        return out.view(N, k, out.shape[1]).sum(1)  # the width spelled out: with no rows, -1 is ambiguous

    @staticmethod
    def backward(ctx, grad_out):
        x, gates, fc_weight, proj_weight, proj_bias, slot, key, offsets, gate, h = ctx.saved_tensors
        k, E, R, N = ctx.k, fc_weight.shape[0], slot.numel(), x.shape[0]
        dout = grad_out.to(x.dtype).contiguous()  # a slot's gradient is its token's: dout[slot // k]
        a = F.gelu(h, approximate="tanh")
        da = _grouped_mm_op(dout, proj_weight.transpose(1, 2), None, gate, slot, offsets, k, True, False, R, x.dtype)
        d_proj_weight = _weight_grad_op(a, dout, gate, slot, offsets, 1, k, False, True)
        pre = _grouped_mm_op(a, proj_weight, proj_bias, None, slot, offsets, 1, False, False, R, torch.float32)
        d_pre_unscaled = dout[slot // k].float() * (key < E)[:, None]
        d_gate_rows = (d_pre_unscaled * pre).sum(-1)
        d_gates = torch.zeros(R, device=x.device, dtype=torch.float32).index_put_((slot,), d_gate_rows)
        d_proj_bias = _segment_sum(d_pre_unscaled * gate[:, None], key, E)
        dh = torch.ops.aten.gelu_backward(da, h, approximate="tanh")
        dx = _grouped_mm_op(dh, fc_weight.transpose(1, 2), None, None, slot, offsets, 1, False, True, R,
                            torch.float32).view(N, k, x.shape[1]).sum(1)
        d_fc_weight = _weight_grad_op(x, dh, None, slot, offsets, k, 1, True, False)
        d_fc_bias = _segment_sum(dh, key, E)
        return (dx.to(x.dtype), d_gates.view(gates.shape).to(gates.dtype), d_fc_weight.to(fc_weight.dtype),
                d_fc_bias.to(ctx.bias_dtypes[0]), d_proj_weight.to(proj_weight.dtype),
                d_proj_bias.to(ctx.bias_dtypes[1]), None, None, None, None)


def experts_grouped(x: torch.Tensor, expert_index: torch.Tensor, gates: torch.Tensor, fc_weight: torch.Tensor,
                    fc_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> torch.Tensor:
    """Each token through the experts it is routed to, weighted by its router gates, as grouped GEMMs.

    Args: as experts_naive's (ops/moe/naive.py).
    Returns:
        (N, d) in x's dtype, as experts_naive (ops/moe/naive.py). Under autocast the GEMMs run in its dtype with
        float32 accumulation; the router weights and the sum over a token's choices stay in float32.
    Raises:
        ValueError, as experts_naive (check_expert_inputs): no experts, an index outside [-1, E), bad shapes.
    """
    check_expert_inputs(x, expert_index, gates, fc_weight, fc_bias, proj_weight, proj_bias)
    E, k = fc_weight.shape[0], expert_index.shape[1]
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x_in, fc_weight, proj_weight = x.to(dtype), fc_weight.to(dtype), proj_weight.to(dtype)
    else:
        x_in = x
    with torch.autocast(x.device.type, enabled=False):
        choice = expert_index.reshape(-1)
        key, slot = torch.sort(torch.where(choice < 0, E, choice), stable=True)  # dropped choices last
        counts = torch.zeros(E + 1, dtype=torch.long, device=key.device).scatter_add_(0, key, torch.ones_like(key))[:E]
        offsets = F.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
        out = _GroupedExperts.apply(x_in.contiguous(), gates.float(), fc_weight, fc_bias, proj_weight, proj_bias,
                                    slot.to(torch.int32), key, offsets, k)
    return out.to(x.dtype)
