"""Transformer-XL relative attention over [prefix; segment] as one Triton kernel with an online softmax (the
FlashAttention scheme), forward and backward; naive.py is the reference.

FlashAttention has no place for the position term q_i.r_{P+i-j}, which depends on the query and the distance.
For a tile of BLOCK_M queries from m0 and BLOCK_N keys from n0 the distances P + i - j run over a window of
BLOCK_M + BLOCK_N - 1 rows of r starting at base = P + m0 - n0 - BLOCK_N + 1. The kernel multiplies the queries
by that window, pw = (q + w) @ r_window^T (BLOCK_M x BLOCK_W), and moves each entry to its key with a gather along
the rows: pos[i, j] = pw[i, i - j + BLOCK_N - 1], the relative shift done per tile in registers. The content term
is (q + u) @ k^T; the caller adds u and w to the queries. Backward: the score gradient ds goes to qu and k as in
FlashAttention; its gather back, dpw[i, t] = ds[i, i + BLOCK_N - 1 - t], gives the queries' position gradient
dpw @ r_window and the window's gradient dpw^T @ qw, added to dr with atomics (every tile on the same diagonal
writes the same rows). The key/value kernel recomputes the scores per key tile, the query kernel per query tile.
"""
import torch
import triton
import triton.language as tl

from languini.triton_utils import interpreting


@triton.jit
def _load_rows(ptr, rows, n_rows, stride, offs_d, D, UPCAST: tl.constexpr):
    """The rows `rows` of a (n_rows, D) matrix with row stride `stride`, zero outside it; fp32 under UPCAST (the
    interpreter's bf16 arithmetic is wrong)."""
    t = tl.load(ptr + rows[:, None] * stride + offs_d[None, :],
                mask=(rows[:, None] >= 0) & (rows[:, None] < n_rows) & (offs_d[None, :] < D), other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in fp32: IEEE fp32 products for fp32 inputs, else a cast to b's dtype (tensor cores)."""
    if IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


@triton.jit
def _scores(qu, qw, k_ptr, r_ptr, n0, m0, P, S, D, stride_ks, stride_rs, offs_m, offs_n, offs_w, offs_d,
            UPCAST: tl.constexpr, IEEE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile's key block (BLOCK_N, BLOCK_D), r window (BLOCK_W, BLOCK_D) and masked scores (A+B+C+D) before the
    scale, -inf where key j is beyond query i's reach or past the keys (rows past T are not masked)."""
    keys = n0 + offs_n
    kt = _load_rows(k_ptr, keys, S, stride_ks, offs_d, D, UPCAST)
    rows = P + m0 - n0 - BLOCK_N + 1 + offs_w
    rw = _load_rows(r_ptr, rows, S, stride_rs, offs_d, D, UPCAST)
    s = _dot(qu, tl.trans(kt), IEEE)
    pw = _dot(qw, tl.trans(rw), IEEE)
    s += tl.gather(pw, (offs_m - m0)[:, None] - offs_n[None, :] + BLOCK_N - 1, axis=1)
    reach = (keys[None, :] <= P + offs_m[:, None]) & (keys[None, :] < S)
    return kt, rw, rows, tl.where(reach, s, float("-inf"))


@triton.jit
def compressive_rel_attention_fwd_kernel(
        o_ptr, lse_ptr, qu_ptr, qw_ptr, k_ptr, v_ptr, r_ptr, T, S, P, D, H, scale,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_ks, stride_rh, stride_rs,
        UPCAST: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr):
    """o and the log-sum-exp of the scaled scores for one tile of queries of one (batch, head)."""
    m0, bh = tl.program_id(0) * BLOCK_M, tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m, offs_n = m0 + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N)
    offs_w, offs_d = tl.arange(0, BLOCK_W), tl.arange(0, BLOCK_D)
    q_base = b * stride_qb + h * stride_qh
    qu = _load_rows(qu_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
    qw = _load_rows(qw_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_kb + h * stride_kh
    r_ptr += h * stride_rh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # key 0 is within every query's reach, so each row's running maximum is finite after the first tile
    for n0 in range(0, tl.minimum(S, P + m0 + BLOCK_M), BLOCK_N):
        kt, rw, rows, s = _scores(qu, qw, k_ptr, r_ptr, n0, m0, P, S, D, stride_ks, stride_rs, offs_m, offs_n,
                                  offs_w, offs_d, UPCAST, IEEE, BLOCK_N)
        s = s * scale
        vt = _load_rows(v_ptr, n0 + offs_n, S, stride_ks, offs_d, D, UPCAST)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p, vt, IEEE)
        m_i = m_new
    q_at = q_base + offs_m[:, None] * stride_qt + offs_d[None, :]
    q_mask = (offs_m[:, None] < T) & (offs_d[None, :] < D)
    tl.store(o_ptr + q_at, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=q_mask)
    tl.store(lse_ptr + bh * T + offs_m, m_i + tl.log(l_i), mask=offs_m < T)


@triton.jit
def compressive_rel_attention_bwd_query_kernel(
        dqu_ptr, dqw_ptr, dr_ptr, qu_ptr, qw_ptr, k_ptr, v_ptr, r_ptr, do_ptr, lse_ptr, delta_ptr,
        T, S, P, D, H, scale,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_ks, stride_rh, stride_rs,
        UPCAST: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr):
    """dqu, dqw for one tile of queries of one (batch, head), and its share of dr (fp32, atomics)."""
    m0, bh = tl.program_id(0) * BLOCK_M, tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m, offs_n = m0 + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N)
    offs_w, offs_d = tl.arange(0, BLOCK_W), tl.arange(0, BLOCK_D)
    q_base = b * stride_qb + h * stride_qh
    qu = _load_rows(qu_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
    qw = _load_rows(qw_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
    do = _load_rows(do_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
    lse = tl.load(lse_ptr + bh * T + offs_m, mask=offs_m < T, other=0.0)
    delta = tl.load(delta_ptr + bh * T + offs_m, mask=offs_m < T, other=0.0)
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_kb + h * stride_kh
    r_ptr += h * stride_rh
    dr_ptr += h * stride_rh
    # dpw[i, t] = ds[i, i + BLOCK_N - 1 - t] where that is a key of the tile
    back = (offs_m - m0)[:, None] + BLOCK_N - 1 - offs_w[None, :]
    in_tile = (back >= 0) & (back < BLOCK_N)
    back = tl.minimum(tl.maximum(back, 0), BLOCK_N - 1)
    dqu = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dqw = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, tl.minimum(S, P + m0 + BLOCK_M), BLOCK_N):
        kt, rw, rows, s = _scores(qu, qw, k_ptr, r_ptr, n0, m0, P, S, D, stride_ks, stride_rs, offs_m, offs_n,
                                  offs_w, offs_d, UPCAST, IEEE, BLOCK_N)
        p = tl.where(offs_m[:, None] < T, tl.exp(s * scale - lse[:, None]), 0.0)
        vt = _load_rows(v_ptr, n0 + offs_n, S, stride_ks, offs_d, D, UPCAST)
        ds = p * (_dot(do, tl.trans(vt), IEEE) - delta[:, None]) * scale  # the gradient of the unscaled scores
        dpw = tl.where(in_tile, tl.gather(ds, back, axis=1), 0.0)
        dqu += _dot(ds, kt, IEEE)
        dqw += _dot(dpw, rw, IEEE)
        tl.atomic_add(dr_ptr + rows[:, None] * stride_rs + offs_d[None, :], _dot(tl.trans(dpw), qw, IEEE),
                      mask=(rows[:, None] >= 0) & (rows[:, None] < S) & (offs_d[None, :] < D))
    q_at = q_base + offs_m[:, None] * stride_qt + offs_d[None, :]
    q_mask = (offs_m[:, None] < T) & (offs_d[None, :] < D)
    tl.store(dqu_ptr + q_at, dqu.to(dqu_ptr.dtype.element_ty), mask=q_mask)
    tl.store(dqw_ptr + q_at, dqw.to(dqw_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def compressive_rel_attention_bwd_key_kernel(
        dk_ptr, dv_ptr, qu_ptr, qw_ptr, k_ptr, v_ptr, r_ptr, do_ptr, lse_ptr, delta_ptr, T, S, P, D, H, scale,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_ks, stride_rh, stride_rs,
        UPCAST: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr):
    """dk, dv for one tile of keys of one (batch, head), over the query tiles that reach it."""
    n0, bh = tl.program_id(0) * BLOCK_N, tl.program_id(1)
    b, h = bh // H, bh % H
    offs_n, offs_w, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_W), tl.arange(0, BLOCK_D)
    keys = n0 + offs_n
    k_ptr += b * stride_kb + h * stride_kh
    v_ptr += b * stride_kb + h * stride_kh
    r_ptr += h * stride_rh
    vt = _load_rows(v_ptr, keys, S, stride_ks, offs_d, D, UPCAST)
    q_base = b * stride_qb + h * stride_qh
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # the first query reaching key n0 is n0 - P
    for m0 in range(tl.maximum(n0 - P, 0) // BLOCK_M * BLOCK_M, T, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        qu = _load_rows(qu_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
        qw = _load_rows(qw_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
        do = _load_rows(do_ptr + q_base, offs_m, T, stride_qt, offs_d, D, UPCAST)
        lse = tl.load(lse_ptr + bh * T + offs_m, mask=offs_m < T, other=0.0)
        delta = tl.load(delta_ptr + bh * T + offs_m, mask=offs_m < T, other=0.0)
        kt, rw, rows, s = _scores(qu, qw, k_ptr, r_ptr, n0, m0, P, S, D, stride_ks, stride_rs, offs_m, offs_n,
                                  offs_w, offs_d, UPCAST, IEEE, BLOCK_N)
        p = tl.where(offs_m[:, None] < T, tl.exp(s * scale - lse[:, None]), 0.0)
        dv += _dot(tl.trans(p), do, IEEE)
        ds = p * (_dot(do, tl.trans(vt), IEEE) - delta[:, None]) * scale
        dk += _dot(tl.trans(ds), qu, IEEE)
    kv_at = b * stride_kb + h * stride_kh + keys[:, None] * stride_ks + offs_d[None, :]
    kv_mask = (keys[:, None] < S) & (offs_d[None, :] < D)
    tl.store(dk_ptr + kv_at, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + kv_at, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


def _launch_config(D: int, dtype: torch.dtype, kernel: str) -> dict:
    """Square tiles of queries and keys, the window of r rows twice as long. bf16: 64 (the query-gradient kernel,
    which holds the most tiles, 32); fp32 (IEEE products, no tensor cores): 32. Chosen from the compiler's
    register counts (scripts/kernel_cost.py, sm_90: the bf16 forward and key-gradient kernels do not spill), not
    tuned on a GPU."""
    block_d = max(16, triton.next_power_of_2(D))
    block = 64 if dtype != torch.float32 and kernel != "bwd_query" and block_d <= 64 else 32
    return {"BLOCK_M": block, "BLOCK_N": block, "BLOCK_W": 2 * block, "BLOCK_D": block_d,
            "num_warps": 8 if block == 64 else 4, "num_stages": 2}


def _strides(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor) -> tuple:
    return (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), r.stride(0), r.stride(1))


def _flags(dtype: torch.dtype) -> dict:
    return {"UPCAST": interpreting(), "IEEE": dtype == torch.float32}


@torch.library.custom_op("compressive::rel_attention_fwd", mutates_args=())
def _forward_op(qu: torch.Tensor, qw: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o (B, H, T, D) in qu's dtype, the log-sum-exp of each query's scaled scores (B, H, T) fp32)."""
    B, H, T, D = qu.shape
    S = k.shape[2]
    o = torch.empty_like(qu)
    lse = torch.empty(B, H, T, device=qu.device, dtype=torch.float32)
    blocks = _launch_config(D, qu.dtype, "fwd")
    grid = (triton.cdiv(T, blocks["BLOCK_M"]), B * H)
    compressive_rel_attention_fwd_kernel[grid](o, lse, qu, qw, k, v, r, T, S, S - T, D, H, scale,
                                               *_strides(qu, k, r), **_flags(qu.dtype), **blocks)
    return o, lse


@_forward_op.register_fake
def _(qu, qw, k, v, r, scale):
    return torch.empty_like(qu), qu.new_empty(qu.shape[:3], dtype=torch.float32)


@torch.library.custom_op("compressive::rel_attention_bwd", mutates_args=())
def _backward_op(do: torch.Tensor, qu: torch.Tensor, qw: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 r: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dqu, dqw, dk, dv, dr), dr fp32."""
    B, H, T, D = qu.shape
    S = k.shape[2]
    delta = (o.float() * do.float()).sum(-1)  # sum_j p_ij dp_ij, the softmax backward's row term
    dqu, dqw = torch.empty_like(qu), torch.empty_like(qw)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dr = torch.zeros(r.shape, device=r.device, dtype=torch.float32)
    flags, args = _flags(qu.dtype), (T, S, S - T, D, H, scale, *_strides(qu, k, r))
    blocks = _launch_config(D, qu.dtype, "bwd_query")
    compressive_rel_attention_bwd_query_kernel[(triton.cdiv(T, blocks["BLOCK_M"]), B * H)](
        dqu, dqw, dr, qu, qw, k, v, r, do, lse, delta, *args, **flags, **blocks)
    blocks = _launch_config(D, qu.dtype, "bwd_key")
    compressive_rel_attention_bwd_key_kernel[(triton.cdiv(S, blocks["BLOCK_N"]), B * H)](
        dk, dv, qu, qw, k, v, r, do, lse, delta, *args, **flags, **blocks)
    return dqu, dqw, dk, dv, dr


@_backward_op.register_fake
def _(do, qu, qw, k, v, r, o, lse, scale):
    return (torch.empty_like(qu), torch.empty_like(qw), torch.empty_like(k), torch.empty_like(v),
            r.new_empty(r.shape, dtype=torch.float32))


class _RelativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qu, qw, k, v, r, scale):
        o, lse = _forward_op(qu, qw, k, v, r, scale)
        ctx.save_for_backward(qu, qw, k, v, r, o, lse)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        qu, qw, k, v, r, o, lse = ctx.saved_tensors
        dqu, dqw, dk, dv, dr = _backward_op(do.contiguous(), qu, qw, k, v, r, o, lse, ctx.scale)
        return dqu, dqw, dk, dv, dr.to(r.dtype), None


def relative_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, u: torch.Tensor,
                              w: torch.Tensor, scale: float) -> torch.Tensor:
    """Transformer-XL relative attention of the segment's queries over [prefix; segment], as naive.py's
    relative_attention_naive (default mask: every prefix key, the segment causally), without the (T, S) scores.

    Args: as relative_attention_naive's, without the mask.
    Returns:
        (B, H, T, D) in the dtype the tensors run in: autocast's if enabled, else q's. Accumulation is fp32.
    """
    if not q.is_cuda and not interpreting():
        raise ValueError("The Triton relative-attention kernel needs a GPU (or TRITON_INTERPRET=1 set before any "
                         "kernel is defined, as the tests do); on CPU use --attention_impl naive or auto.")
    if k.shape[2] < q.shape[2] or r.shape[1] != k.shape[2]:
        raise ValueError(f"need S >= T keys and S rows of r; got T={q.shape[2]}, S={k.shape[2]}, r rows "
                         f"{r.shape[1]}")
    dtype = torch.get_autocast_dtype(q.device.type) if torch.is_autocast_enabled(q.device.type) else q.dtype
    with torch.autocast(q.device.type, enabled=False):
        qu = (q.float() + u.float()[:, None]).to(dtype).contiguous()
        qw = (q.float() + w.float()[:, None]).to(dtype).contiguous()
        k, v, r = (t.to(dtype).contiguous() for t in (k, v, r))
        return _RelativeAttention.apply(qu, qw, k, v, r, scale)
