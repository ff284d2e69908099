"""The grouped Triton experts against the per-expert loop (and torch's grouped_mm where it exists): outputs and
the gradients of the inputs, both weights and biases, and the router weights, with empty experts, one expert
taking everything, dropped choices and odd sizes. Under the Triton interpreter on CPU (tests/conftest.py)."""
import pytest
import torch
import torch.nn.functional as F

from projects.switch_gpt.ops.moe.naive import experts_naive
from projects.switch_gpt.ops.moe.triton import experts_grouped

CASES = [  # N tokens, d, h, E, k, routing
    pytest.param(13, 24, 40, 4, 1, "random", id="odd-top1"),
    pytest.param(9, 16, 32, 3, 2, "random", id="top2"),
    pytest.param(11, 20, 36, 5, 1, "empty", id="empty-experts"),
    pytest.param(10, 16, 24, 4, 1, "one", id="one-expert-takes-all"),
    pytest.param(12, 16, 32, 3, 2, "dropped", id="dropped-choices"),
]


def routing(N, E, k, kind, generator):
    if kind == "one":
        return torch.full((N, k), 2)
    if kind == "empty":  # only experts 1 and 3 of 5 get tokens
        return torch.tensor([1, 3])[torch.randint(2, (N, k), generator=generator)]
    choice = torch.stack([torch.randperm(E, generator=generator)[:k] for _ in range(N)])
    if kind == "dropped":
        choice[torch.rand(N, k, generator=generator) < 0.3] = -1
    return choice


def inputs(N, d, h, E, k, kind, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(N * 1000 + E)
    tensors = [torch.randn(N, d, generator=g), torch.rand(N, k, generator=g), torch.randn(E, d, h, generator=g) / d ** 0.5,
               torch.randn(E, h, generator=g) * 0.1, torch.randn(E, h, d, generator=g) / h ** 0.5,
               torch.randn(E, d, generator=g) * 0.1]
    tensors = [t.to(device=device, dtype=dtype if i != 1 else torch.float32).requires_grad_() for i, t in
               enumerate(tensors)]
    return routing(N, E, k, kind, g).to(device), tensors


@pytest.mark.parametrize("N,d,h,E,k,kind", CASES)
def test_grouped_experts_match_the_loop(N, d, h, E, k, kind, device):
    expert_index, tensors = inputs(N, d, h, E, k, kind, device)
    x, gates, *weights = tensors
    upstream = torch.randn(N, d, generator=torch.Generator().manual_seed(1)).to(device)
    grads = {}
    for name, fn in (("loop", experts_naive), ("grouped", experts_grouped)):
        out = fn(x, expert_index, gates, *weights)
        grads[name] = (out, *torch.autograd.grad(out, tensors, upstream))
    # fp32 sums over at most h = 40 products: a few ulps of the largest terms
    for ref, got, what in zip(grads["loop"], grads["grouped"], ("out", "x", "gates", "W1", "b1", "W2", "b2")):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def test_bf16_inputs_under_autocast_are_close_to_fp32(device):
    expert_index, tensors = inputs(17, 32, 48, 4, 1, "random", device)
    x, gates, *weights = tensors
    reference = experts_naive(x, expert_index, gates, *weights)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = experts_grouped(x, expert_index, gates, *weights)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)  # bf16 operands, 8 bits of mantissa


@pytest.mark.skipif(not hasattr(F, "grouped_mm"), reason="this torch has no torch.nn.functional.grouped_mm")
def test_first_linear_matches_torch_grouped_mm(device):
    """torch's grouped_mm as a second reference of the gathered grouped GEMM (where torch supports the device)."""
    E, d, h = 3, 16, 32
    g = torch.Generator().manual_seed(0)
    choice = torch.tensor([0, 2, 2, 0, 2, 2, 0, 2]).to(device)
    x, w = torch.randn(8, d, generator=g).to(device), torch.randn(E, d, h, generator=g).to(device)
    key, slot = torch.sort(choice, stable=True)
    ends = torch.bincount(key, minlength=E).cumsum(0).to(torch.int32)
    try:
        reference = F.grouped_mm(x[slot], w, offs=ends)
    except (RuntimeError, NotImplementedError) as error:
        pytest.skip(f"grouped_mm does not run here: {error}")
    zero = torch.zeros(E, h, device=device)
    proj = torch.eye(h, d, device=device).expand(E, h, d).contiguous()  # the second layer reads h's first d
    out = experts_grouped(x, choice[:, None], torch.ones(8, 1, device=device), w, zero, proj, torch.zeros(E, d, device=device))
    torch.testing.assert_close(out[slot], F.gelu(reference, approximate="tanh")[:, :d], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("routing_kind", [pytest.param("top1", id="top1"), pytest.param("top2", id="top2")])
def test_model_on_the_kernel_matches_the_loop_in_training(routing_kind, device):
    """The whole model, capacity binding (factor 0.5), on either path: the same loss and gradients."""
    from projects.switch_gpt import configs
    from projects.switch_gpt.model import Model

    cfg = configs.get("cpu", vocab_size=64, seq_len=16, d_model=32, n_heads=2, d_head=16, n_experts=4,
                      routing=routing_kind, capacity_factor=0.5, moe_layers="every")
    torch.manual_seed(0)
    loop = Model(cfg).to(device)
    grouped = Model(configs.get("cpu", **{**cfg.__dict__, "experts_impl": "triton"})).to(device)
    grouped.load_state_dict(loop.state_dict())
    x = torch.randint(64, (3, 16), device=device)
    losses = []
    for model in (loop, grouped):
        logits, _, aux = model(x)
        loss = logits.float().square().mean() + sum(aux.values())
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert grouped.train_metrics()["moe_drop_rate"] > 0  # the capacity did bind
    for (name, p), q in zip(loop.named_parameters(), grouped.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.filterwarnings("ignore")
def test_forward_flops_agree_on_both_paths(device):
    """The profiler sees the loop's expert products; on the kernel path extra_flops adds them instead. Both are the
    nominal count, every token's k choices (forward_flops counts in eval mode, where no choice is dropped for
    capacity): the same from every initialisation, though in training the routing, so the overflow, differs."""
    from languini import flops
    from projects.switch_gpt import configs
    from projects.switch_gpt.model import Model

    counts = []
    for impl, seed in (("naive", 0), ("naive", 1), ("triton", 2)):
        torch.manual_seed(seed)
        model = Model(configs.get("cpu", experts_impl=impl, seq_len=32)).to(device).train()
        counts.append(flops.forward_flops(model, 32, 2048, device))
    assert counts[1] == counts[0] and counts[2] == pytest.approx(counts[0], rel=1e-3)


PATHS = [pytest.param(experts_naive, id="loop"), pytest.param(experts_grouped, id="grouped")]
BAD_INPUTS = [  # (what, E, expert_index of 3 tokens, the error's words)
    pytest.param(0, [[0], [0], [0]], "at least one expert", id="no-experts"),
    pytest.param(3, [[0], [3], [1]], r"must lie in \[-1, 3\).* from 0 to 3", id="index-equal-to-E"),
    pytest.param(3, [[0], [7], [1]], r"must lie in \[-1, 3\).* from 0 to 7", id="index-above-E"),
    pytest.param(3, [[0], [-2], [1]], r"must lie in \[-1, 3\).* from -2 to 1", id="index-below-minus-1"),
    pytest.param(3, [[0, 1], [1, 2], [2, 0]], "gates must have the shape of expert_index", id="gates-shape"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("E,index,message", BAD_INPUTS)
def test_bad_inputs_give_the_same_clear_error_on_every_path(path, E, index, message, device):
    d, h = 8, 16
    x, gates = torch.randn(3, d, device=device), torch.rand(3, 1, device=device)
    weights = [torch.randn(E, d, h, device=device), torch.zeros(E, h, device=device),
               torch.randn(E, h, d, device=device), torch.zeros(E, d, device=device)]
    with pytest.raises(ValueError, match=message):
        path(x, torch.tensor(index, device=device), gates, *weights)


@pytest.mark.parametrize("k", [1, 2, 0])
def test_no_tokens_give_the_same_empty_result_on_every_path(k, device):
    """No tokens (or no choices): an empty (0, d) result, and zero gradients for every weight, on either path."""
    results = []
    for path in (experts_naive, experts_grouped):
        N = 0 if k else 5
        _, tensors = inputs(N, 8, 16, 3, k, "one", device)
        x, gates, *weights = tensors
        out = path(x, torch.zeros(N, k, dtype=torch.long, device=device), gates, *weights)
        out.sum().backward()
        results.append((out, *(w.grad for w in weights)))
    for ref, got in zip(*results):
        assert got.shape == ref.shape and not got.any() and not ref.any()
    assert results[0][0].shape == (0 if k else 5, 8)
