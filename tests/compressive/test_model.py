"""The Compressive Transformer and Transformer-XL (projects/compressive) against references written from the
equations: relative attention by brute force, streaming against one pass, the FIFOs against a hand-worked
example, and the isolation of the attention-reconstruction loss (thesis, Algorithms 5 and 6)."""
import math

import pytest
import torch
import torch.nn.functional as F

from projects.compressive import configs
from projects.compressive import model as compressive
from projects.compressive.model import Model, RelativeAttention

TINY = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_head=8)


def tiny(**overrides):
    return configs.ModelConfig(**{**TINY, **overrides})


def brute_force_attention(attn, h, prefix):
    """Transformer-XL attention (Dai et al. 2019, section 3.3) as a sum over every query, head and key:
    score = q.k + q.W_R R_{i-j} + u.k + v.W_R R_{i-j}, R the sinusoids of the distance, softmax over the keys up to
    the query, weighted values, output projection."""
    B, T, d = h.shape
    P, H, dh = prefix.shape[1], attn.n_heads, attn.d_head
    x = torch.cat([prefix, h], dim=1)
    w_q, w_k, w_v = attn.qkv.weight.split(H * dh)
    b_q, b_k, b_v = attn.qkv.bias.split(H * dh)

    def rel(distance):
        return torch.tensor([math.sin(distance / 10000 ** (f / d)) if f % 2 == 0 else
                             math.cos(distance / 10000 ** ((f - 1) / d)) for f in range(d)], dtype=h.dtype)

    out = torch.zeros(B, T, H * dh, dtype=h.dtype)
    for b in range(B):
        for i in range(T):
            for head in range(H):
                rows = slice(head * dh, (head + 1) * dh)
                q = w_q[rows] @ h[b, i] + b_q[rows]
                u, v = attn.u[head], attn.v[head]
                scores, values = [], []
                for j in range(P + i + 1):  # every memory, the segment up to the query
                    k = w_k[rows] @ x[b, j] + b_k[rows]
                    r = attn.pos.weight[rows] @ rel(P + i - j)
                    scores.append((q @ k + q @ r + u @ k + v @ r) / math.sqrt(dh))
                    values.append(w_v[rows] @ x[b, j] + b_v[rows])
                weights = torch.softmax(torch.stack(scores), dim=0)
                out[b, i, rows] = (weights[:, None] * torch.stack(values)).sum(0)
    return out @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("T,P", [(5, 3), (4, 0), (1, 6), (3, 7)])
def test_relative_attention_matches_the_brute_force_sum(T, P):
    torch.manual_seed(T * 10 + P)
    attn = RelativeAttention(tiny()).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.5)  # u, v and the biases nonzero, so every term counts
    h, prefix = torch.randn(2, T, 16, dtype=torch.float64), torch.randn(2, P, 16, dtype=torch.float64)
    with torch.no_grad():
        # float64 throughout but the model's sinusoids, fp32 (rounding ~1e-7); a wrong term or shift is off by O(1)
        torch.testing.assert_close(attn(h, prefix), brute_force_attention(attn, h, prefix), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mem_len", [3, 6, 9])
def test_two_segments_with_memory_equal_one_pass_with_the_memory_mask(mem_len, monkeypatch):
    """Transformer-XL (no compression): the second segment's query at position t reads the segment up to t and the
    mem_len positions before the segment, in every layer; one pass over both segments with that mask (and the
    first segment causal) gives the same logits."""
    T = 6
    torch.manual_seed(0)
    model = Model(tiny(seq_len=T, mem_len=mem_len, cmem_len=0)).eval()
    x = torch.randint(50, (2, 2 * T))
    with torch.no_grad():
        first, state, _ = model(x[:, :T])
        second, _, _ = model(x[:, T:], state)
        streamed = torch.cat([first, second], dim=1)

        def one_pass_mask(length, prefix, device):
            assert (length, prefix) == (2 * T, 0)
            t, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
            segment_start = t // T * T
            return (j <= t) & (j >= segment_start - mem_len)

        monkeypatch.setattr(compressive, "memory_mask", one_pass_mask)
        one_pass, _, _ = model(x)
    if mem_len >= T:  # the whole first segment is remembered: plain causal attention over both
        monkeypatch.undo()
        with torch.no_grad():
            # the model's own mask against the test's: fp32 logits of order 1, a wrong mask is off by ~0.1
            torch.testing.assert_close(model(x)[0], one_pass, rtol=1e-6, atol=1e-6)
    # fp32, sums of a few dozen terms of order 1
    torch.testing.assert_close(streamed, one_pass, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compression", ["conv", "mean", "max"])
def test_fifo_bookkeeping_against_a_hand_worked_example(compression):
    """n_m = 4, n_cm = 3, c = 2, segments of 3 tokens; f_c set to the mean of each pair, token t's memory is the
    vector t. By hand (Algorithm 5, lines 8-11; floor(n/c) compressed memories, the odd one out dropped):
      segment 1 (1 2 3):    memory 1 2 3,        nothing evicted
      segment 2 (4 5 6):    memory 3 4 5 6,      evicted 1 2 -> 1.5;          compressed 1.5
      segment 3 (7 8 9):    memory 6 7 8 9,      evicted 3 4 5 -> 3.5;        compressed 1.5 3.5
      segment 4 (10 11 12): memory 9 10 11 12,   evicted 6 7 8 -> 6.5;        compressed 1.5 3.5 6.5
      segment 5 (13 14 15): memory 12 13 14 15,  evicted 9 10 11 -> 9.5;      compressed 3.5 6.5 9.5 (1.5 out)
    Max pooling keeps the later of each pair: 2, 4, 7, 10.
    """
    model = Model(tiny(mem_len=4, cmem_len=3, compression_rate=2, compression=compression))
    block = model.blocks[0]
    if compression == "conv":
        with torch.no_grad():
            block.compress.weight.copy_(0.5 * torch.eye(16)[:, :, None].expand(16, 16, 2))
    else:
        assert block.compress is None  # pooling has no parameters
    cm = [2, 4, 7, 10] if compression == "max" else [1.5, 3.5, 6.5, 9.5]
    expected = [([1, 2, 3], []), ([3, 4, 5, 6], cm[:1]), ([6, 7, 8, 9], cm[:2]), ([9, 10, 11, 12], cm[:3]),
                ([12, 13, 14, 15], cm[1:])]
    mem = cmem = torch.zeros(1, 0, 16)
    for segment, (want_mem, want_cmem) in enumerate(expected):
        h = torch.arange(3 * segment + 1, 3 * segment + 4, dtype=torch.float32)[None, :, None].expand(1, 3, 16)
        mem, cmem, loss = model.update_memories(block, h, mem, cmem)
        torch.testing.assert_close(mem[0, :, 0], torch.tensor(want_mem, dtype=torch.float32))
        torch.testing.assert_close(cmem[0, :, 0], torch.tensor(want_cmem, dtype=torch.float32))
        assert (loss is None) == (segment == 0)


def test_transformer_xl_drops_what_leaves_its_memory():
    model = Model(tiny(mem_len=4, cmem_len=0))
    mem = cmem = torch.zeros(1, 0, 16)
    for segment in range(3):
        h = torch.arange(3 * segment + 1, 3 * segment + 4, dtype=torch.float32)[None, :, None].expand(1, 3, 16)
        mem, cmem, loss = model.update_memories(model.blocks[0], h, mem, cmem)
    assert mem[0, :, 0].tolist() == [6, 7, 8, 9] and cmem.shape[1] == 0 and loss is None


def three_segments(model):
    """Logits and aux of the third of three segments of 4 tokens, run with gradients throughout."""
    torch.manual_seed(1)
    state = None
    for _ in range(3):
        x = torch.randint(50, (2, 4))
        logits, state, aux = model(x, state)
    return logits, x, aux


def isolated_model():
    torch.manual_seed(0)
    # memory 4 = segment: every segment from the second evicts 4 memories, compressed to 2
    return Model(tiny(seq_len=4, mem_len=4, cmem_len=4, compression_rate=2)).train()


def compressors(model):
    return {name for name, _ in model.named_parameters() if ".compress." in name}


def test_reconstruction_loss_reaches_only_the_compressors():
    model = isolated_model()
    _, _, aux = three_segments(model)
    aux["reconstruction"].backward()
    touched = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert touched == compressors(model)


def test_language_model_loss_never_reaches_the_compressors():
    model = isolated_model()
    logits, x, aux = three_segments(model)  # the third segment attends over memories compressed in the second
    F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    for name, p in model.named_parameters():
        if name in compressors(model):
            assert p.grad is None, name
        elif name.startswith("blocks.") or name in ("tok_emb.weight", "head.weight"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_key_value_projections_keep_training_after_a_step_with_the_reconstruction_loss():
    """The trap of a public port: `weight.detach_()` on the projections inside the reconstruction loss stops them
    training for good. Here a step on LM + reconstruction loss moves them, and the next step's LM loss reaches them."""
    model = isolated_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = [block.attn.qkv.weight.detach().clone() for block in model.blocks]
    logits, x, aux = three_segments(model)
    (F.cross_entropy(logits.flatten(0, 1), x.flatten()) + aux["reconstruction"]).backward()
    opt.step()
    opt.zero_grad()
    logits, x, aux = three_segments(model)
    F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    inner = 16
    for block, old in zip(model.blocks, before):
        weight = block.attn.qkv.weight
        assert weight.requires_grad and weight.is_leaf
        assert (weight.detach()[inner:] - old[inner:]).abs().amax() > 0  # keys and values moved in the step
        assert weight.grad[inner:].abs().amax() > 0  # and still get LM gradients


def test_configs_follow_the_thesis_recipe():
    for name in ("mini", "tiny", "small", "medium"):
        cfg, txl = configs.get(name), configs.get(f"txl_{name}")
        assert (cfg.seq_len, cfg.mem_len, cfg.cmem_len, cfg.compression_rate) == (512, 512, 512, 2)
        assert (txl.seq_len, txl.mem_len, txl.cmem_len) == (512, 1024, 0)
        assert (txl.d_model, txl.n_layers) == (cfg.d_model, cfg.n_layers)
    assert configs.get("txl_cpu").cmem_len == 0
    assert all(c["grad_clip"] == 0.1 for c in configs.COMPUTE_CLASSES.values())


def test_memory_stats_average_the_reconstruction_loss_per_layer():
    model = isolated_model().eval()
    model.reset_memory_stats()
    state, losses = None, []
    with torch.no_grad():
        for segment in range(3):  # the second and third segments compress
            _, state, aux = model(torch.randint(50, (2, 4)), state)
            losses.append(aux["reconstruction"])
    stats = model.memory_stats()
    assert stats["compressions"] == 2 * 2  # two segments, two layers
    per_layer = stats["reconstruction_loss_per_layer"]
    assert len(per_layer) == 2 and all(v > 0 for v in per_layer)
    # the aux loss is the sum over layers: the layers' means add up to the mean of the segments' sums
    assert sum(per_layer) == pytest.approx(float(losses[1] + losses[2]) / 2, rel=1e-5)


@pytest.mark.parametrize("cmem_len,compression", [(0, "conv"), (4, "conv"), (4, "max")])
def test_extra_flops_are_what_full_memories_add_to_an_empty_state_forward(cmem_len, compression):
    """torch's FLOP counter (matmuls, einsums, the convolution) on one segment with full memories, minus the same
    segment with empty memories (which compresses nothing): what the profiler, run with empty memory, misses."""
    from torch.utils.flop_counter import FlopCounterMode

    T = 4
    model = Model(tiny(seq_len=T, mem_len=4, cmem_len=cmem_len, compression_rate=2, compression=compression)).eval()
    x = torch.randint(50, (1, T))
    full = [(torch.randn(1, 4, 16), torch.randn(1, cmem_len, 16)) for _ in model.blocks]

    def count(state):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x, state)
        return counter.get_total_flops()

    assert count(full) - count(None) == model.extra_flops(T)


def test_a_segment_that_compresses_nothing_gives_every_compressor_a_zero_gradient():
    """Data parallelism expects a gradient for every parameter in every step, also before the first compression."""
    model = isolated_model()
    _, _, aux = model(torch.randint(50, (2, 4)))  # fills the memory, evicts nothing
    aux["reconstruction"].backward()
    assert aux["reconstruction"].item() == 0
    for name, p in model.named_parameters():
        assert (p.grad is not None and not p.grad.any()) if name in compressors(model) else p.grad is None, name


def test_pooling_compressors_train_with_the_language_model_loss_only():
    """Max/mean pooling have no parameters: the reconstruction loss is reported but moves nothing."""
    torch.manual_seed(0)
    model = Model(tiny(seq_len=4, mem_len=4, cmem_len=4, compression="mean")).train()
    logits, x, aux = three_segments(model)
    assert aux["reconstruction"] > 0 and not aux["reconstruction"].requires_grad
    with pytest.raises(ValueError, match="compression must be one of conv, max, mean"):
        Model(tiny(compression="most_used"))


def test_the_triton_path_gives_the_reference_logits_and_gradients_over_segments_with_memory():
    """The whole model through the kernel (ops/rel_attention/triton.py, under the interpreter on CPU) and through the
    reference, over three segments, so the last ones attend over memories and compressed memories."""
    results = {}
    x = torch.randint(50, (2, 15), generator=torch.Generator().manual_seed(0))
    for impl in ("naive", "triton"):
        torch.manual_seed(0)
        model = Model(tiny(seq_len=5, mem_len=4, cmem_len=4, attention_impl=impl))
        with torch.no_grad():
            for block in model.blocks:  # nonzero position and content biases
                block.attn.u.normal_(0, 0.5)
                block.attn.v.normal_(0, 0.5)
        state, logits, loss = None, [], 0
        for segment in x.split(5, dim=1):
            out, state, aux = model(segment, state)
            logits.append(out)
            loss = loss + out.square().mean() + aux["reconstruction"]
        loss.backward()
        results[impl] = (torch.cat(logits, 1), {n: p.grad for n, p in model.named_parameters()})
    # fp32 attention over at most 13 keys of width 8; logits and gradients of order 1
    torch.testing.assert_close(results["triton"][0], results["naive"][0], rtol=1e-4, atol=1e-5)
    for name, grad in results["naive"][1].items():
        torch.testing.assert_close(results["triton"][1][name], grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_every_attention_path_reports_the_same_flops():
    """languini.flops (DeepSpeed's profiler + extra_flops) on the reference and on the Triton path, whose attention
    core the profiler cannot see: equal up to the elementwise operations the paths do differently (the reference's
    sum of four score tensors, the kernel's adding of u and w to the queries), well below one attention core."""
    from languini import flops

    counts = {}
    for impl in ("naive", "triton"):
        torch.manual_seed(0)
        model = Model(tiny(seq_len=16, mem_len=16, cmem_len=16, attention_impl=impl))
        counts[impl] = flops.forward_flops(model, 16, 50)
    core = 2 * model.blocks[0].attn.core_flops(16, 16)  # both layers
    assert abs(counts["triton"] - counts["naive"]) < 0.05 * core, (counts, core)


def test_an_unknown_attention_impl_is_refused():
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        Model(tiny(attention_impl="flash"))
