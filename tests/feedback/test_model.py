"""The Feedback Transformer's fast path (segment.py: one pass over all layers per step, a key/value buffer, the
hand-written backward) against the brute force of tests/feedback/brute_force.py, which recomputes every x_t^l from
scratch for every t from the slides' equations: outputs, carried memory and every parameter's gradient, in float64
through the reference attention and in fp32 through the Triton kernel (interpreter on CPU); odd lengths, a segment
longer and one shorter than the memory, segments of one token, memory carried across segments; causality, the
shared keys and values, the memory weights; decoding token by token; configs and parameter counts."""
import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from projects.feedback import configs
from projects.feedback.ops.window_attention import naive
from projects.feedback.model import Decoder, Model
from tests.feedback import brute_force

VOCAB = 11


def small(**overrides) -> configs.ModelConfig:
    fields = dict(vocab_size=VOCAB, seq_len=16, mem_len=4, d_model=12, n_layers=2, n_heads=2, d_head=3)
    return configs.get("cpu", **{**fields, **overrides})


def model_and_inputs(cfg, T, batch=2, seed=0, dtype=torch.float64):
    """A model with nonzero biases, LayerNorm affines and memory weights (so every term is exercised), tokens, a
    random initial memory and a random upstream gradient for the logits."""
    torch.manual_seed(seed)
    model = Model(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name or "norm" in name or name == "mix_logits":
                p.add_(0.3 * torch.randn_like(p))
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(VOCAB, (batch, T), generator=g)
    memory = torch.randn(batch, cfg.mem_len, cfg.d_model, generator=g, dtype=dtype)
    upstream = torch.randn(batch, T, VOCAB, generator=g, dtype=dtype)
    return model, tokens, memory, upstream


def outputs_and_grads(model, run, upstream):
    model.zero_grad(set_to_none=True)
    logits, memory = run()
    (logits * upstream).sum().backward()
    # a parameter the computation does not reach (the memory weights when no step reads a new memory) has a zero
    # gradient in the fast path and none in the brute force
    return logits.detach(), memory.detach(), {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                                              for n, p in model.named_parameters()}


def assert_matches_brute_force(model, tokens, memory, upstream, tol):
    got = outputs_and_grads(model, lambda: model(tokens, memory), upstream)
    want = outputs_and_grads(model, lambda: brute_force.logits_and_memory(model, tokens, memory), upstream)
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol, msg=lambda m: f"logits: {m}")
    torch.testing.assert_close(got[1], want[1], rtol=tol, atol=tol, msg=lambda m: f"memory: {m}")
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():
        scale = max(grad.abs().max().item(), 1e-3)
        torch.testing.assert_close(got[2][name], grad, rtol=tol, atol=tol * scale, msg=lambda m: f"d {name}: {m}")
        assert grad.abs().max() > 0 or name in ("mix_logits",), f"{name} gets no gradient"


@pytest.mark.parametrize("memory", ["weighted", "average", "layer"])
@pytest.mark.parametrize("T,tau", [(7, 4), (3, 5), (1, 2)], ids=["longer-than-memory", "shorter", "one-token"])
def test_fast_path_matches_brute_force(memory, T, tau):
    cfg = small(mem_len=tau, memory=memory, memory_layer=1, attention_impl="naive")
    # float64: the two differ only by the order of their sums
    assert_matches_brute_force(*model_and_inputs(cfg, T), tol=1e-9)


def test_fast_path_of_three_layers_matches_brute_force():
    """From naive.ONE_PASS_MIN_LAYERS layers on, the backward adds a step's key and value gradients in one pass."""
    assert naive.ONE_PASS_MIN_LAYERS == 3
    cfg = small(mem_len=4, n_layers=naive.ONE_PASS_MIN_LAYERS, attention_impl="naive")
    assert_matches_brute_force(*model_and_inputs(cfg, 7), tol=1e-9)


# 1 layer: the kernel's backward adds the window's key and value gradients per layer; from
# triton.ONE_PASS_MIN_LAYERS = 2 on, it writes the weights and one launch per step adds all layers' (odd batch at 3)
@pytest.mark.parametrize("n_layers,batch,T", [(1, 2, 6), (2, 2, 6), (3, 3, 4)],
                         ids=["1-layer", "2-layers", "3-layers-batch-3"])
def test_kernel_path_matches_brute_force(n_layers, batch, T, device):
    """The model through the Triton kernel in fp32 (on the test device) against the brute force in float64."""
    cfg = small(mem_len=3, n_heads=2, d_head=5, n_layers=n_layers, attention_impl="triton")
    model, tokens, memory, upstream = model_and_inputs(cfg, T, batch=batch, dtype=torch.float32)
    got = outputs_and_grads(model.to(device), lambda: model(tokens.to(device), memory.to(device)),
                            upstream.to(device))
    model.cpu().double()
    want = outputs_and_grads(model, lambda: brute_force.logits_and_memory(model, tokens, memory.double()),
                             upstream.double())
    # fp32 through 1-3 layers and 4-6 recurrent steps of O(1) activations
    for name, a, b in (("logits", got[0], want[0]), ("memory", got[1], want[1])):
        torch.testing.assert_close(a.cpu().double(), b, rtol=2e-4, atol=2e-4, msg=lambda m: f"{name}: {m}")
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name].cpu().double(), grad, rtol=2e-4,
                                   atol=2e-4 * max(grad.abs().max().item(), 1e-3), msg=lambda m: f"d {name}: {m}")


@pytest.mark.parametrize("lengths", [[1] * 9, [4, 5], [2, 6, 1]], ids=["one-token-segments", "4+5", "2+6+1"])
def test_memory_carried_across_segments_equals_one_long_pass(lengths):
    cfg = small(mem_len=3)
    model, tokens, memory, _ = model_and_inputs(cfg, sum(lengths))
    with torch.no_grad():
        want, want_memory = brute_force.logits_and_memory(model, tokens, memory)
        one_pass, one_pass_memory = model(tokens, memory)
        pieces, state, start = [], memory, 0
        for n in lengths:
            logits, state = model(tokens[:, start:start + n], state)
            pieces.append(logits)
            start += n
    torch.testing.assert_close(torch.cat(pieces, dim=1), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(one_pass, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, want_memory, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(one_pass_memory, want_memory, rtol=1e-10, atol=1e-10)


def test_training_and_evaluation_forwards_agree():
    model, tokens, memory, _ = model_and_inputs(small(), 9)
    with torch.no_grad():
        evaluated = model(tokens, memory)
    trained = model(tokens, memory)
    for a, b in zip(evaluated, trained):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-12)


def test_causal_within_and_across_segments():
    model, tokens, memory, _ = model_and_inputs(small(mem_len=3), 8)
    changed = tokens.clone()
    changed[:, 5] = (tokens[:, 5] + 1) % VOCAB
    with torch.no_grad():
        before, state = model(tokens, memory)
        after, changed_state = model(changed, memory)
        next_before, _ = model(tokens[:, :2], state)
        next_after, _ = model(tokens[:, :2], changed_state)
    assert torch.equal(after[:, :5], before[:, :5])  # the same computation up to position 4
    # float64 and the same operations: anything above rounding noise is token 5's influence
    assert (after[:, 5:] - before[:, 5:]).abs().amax(-1).gt(1e-12).all()
    assert (next_after - next_before).abs().amax(-1).gt(1e-12).all()  # the memory carries token 5 on


def test_keys_and_values_are_one_projection_read_by_every_layer():
    cfg = small(n_layers=3, attention_impl="naive")
    model, tokens, memory, upstream = model_and_inputs(cfg, 5)
    names = [name for name, _ in model.named_parameters()]
    assert [n for n in names if n.startswith("kv.")] == ["kv.weight", "kv.bias"]
    assert model.kv.weight.shape == (2 * cfg.n_heads * cfg.d_head, cfg.d_model)
    assert not any(n.startswith("blocks.") and (".k" in n or ".v" in n) for n in names)

    def kv_grad(reading_layers):
        """The gradient of the shared projection when only these layers' attention reaches the residual stream."""
        with torch.no_grad():
            for l, block in enumerate(model.blocks):
                block.o.weight.copy_(saved[l] if l in reading_layers else torch.zeros_like(saved[l]))
        return outputs_and_grads(model, lambda: model(tokens, memory), upstream)[2]["kv.weight"]

    saved = [block.o.weight.detach().clone() for block in model.blocks]
    assert kv_grad([]).abs().max() == 0  # no layer reads the memory: the keys and values reach nothing
    for layer in range(cfg.n_layers):
        assert kv_grad([layer]).abs().max() > 1e-6, f"layer {layer} does not read the shared keys and values"


def test_memory_weights_reach_every_layer():
    cfg = small(n_layers=3)
    model, tokens, memory, upstream = model_and_inputs(cfg, 6)
    grads = outputs_and_grads(model, lambda: model(tokens, memory), upstream)[2]
    assert grads["mix_logits"].shape == (cfg.n_layers + 1,) and grads["mix_logits"].abs().min() > 1e-8
    # with the memory on one layer, the carried memory vectors are exactly that layer's outputs
    for layer in range(cfg.n_layers + 1):
        one = Model(dataclasses.replace(cfg, memory="layer", memory_layer=layer)).double()
        one.load_state_dict({k: v for k, v in model.state_dict().items() if k != "mix_logits"})
        with torch.no_grad():
            _, carried = one(tokens, memory)
            xs, _ = brute_force.layers_at(one, tokens, memory, tokens.shape[1] - 1)
        torch.testing.assert_close(carried[:, -1], xs[layer], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("start", ["carried", "empty"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["fp32", "fp64", "bf16"])
def test_decoding_token_by_token_matches_the_forward(dtype, start):
    """Decoder with a carried memory, or with none (tau zero vectors, as the forward with model.empty_state), in the
    weights' dtype, over 11 tokens: the ring of 4 slots fills and wraps twice. From an empty start the ring slots not
    yet written hold NaN: a step that read one would spread it."""
    cfg = small(mem_len=4)
    model, tokens, memory, _ = model_and_inputs(cfg, 11, dtype=dtype)
    memory = memory if start == "carried" else model.empty_state(tokens.shape[0], tokens.device).to(dtype)
    with torch.no_grad():
        want, _ = model(tokens, memory)
        decoder = Decoder(model, memory if start == "carried" else None, batch=tokens.shape[0])
        if start == "empty":
            decoder.kv[:, :, :, 1:] = float("nan")
        got = torch.stack([decoder.step(tokens[:, t]) for t in range(tokens.shape[1])], dim=1)
    assert got.dtype == want.dtype
    # fp32 and fp64: the same sums in another order; bf16: both paths round each product's inputs to 8 bits
    tolerance = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tolerance, atol=tolerance)
    if dtype == torch.float64:  # and the equations, from the same memory, without segment.py
        with torch.no_grad():
            plain, _ = brute_force.logits_and_memory(model, tokens, memory)
        torch.testing.assert_close(got, plain, rtol=1e-10, atol=1e-10)


class Replay(TorchDispatchMode):
    """What a CUDA graph does with a captured function, on the CPU: records each operation with its arguments while
    it runs once (`with Replay() as r`), then `r.replay()` runs the same operations with the same arguments again,
    on the same tensors (an operation's fresh outputs replaced by its fresh outputs of this replay). A function
    whose work depended on a Python value that changes per call would replay its first call's work."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, out))
        return out

    def replay(self):
        fresh = {}  # id of a tensor the recording made -> this replay's

        def now(x):
            return fresh.get(id(x), x) if isinstance(x, torch.Tensor) else x

        for func, args, kwargs, out in self.calls:
            result = func(*pytree.tree_map(now, args), **pytree.tree_map(now, kwargs))
            for recorded, replayed in zip(pytree.tree_leaves(out), pytree.tree_leaves(result)):
                if isinstance(recorded, torch.Tensor):
                    fresh[id(recorded)] = replayed
        return fresh


def test_full_ring_step_replayed_as_recorded_equals_decoding():
    """Decoder.full_ring_step, what cuda_graph=True captures on a GPU: recorded once on the CPU and replayed as
    recorded (Replay) for 10 more tokens while the ring of 4 wraps twice and a half, its logits and every layer's
    output equal the plain decoder's, and it reads nothing back to the host (which a graph cannot). Position rows
    taken as the plain step's Python slice, or the slot written by a Python index, on purpose fail it."""
    cfg = small(mem_len=4)
    model, tokens, memory, _ = model_and_inputs(cfg, 11, dtype=torch.float32)
    with torch.no_grad():
        plain = Decoder(model, memory, batch=tokens.shape[0])
        want = [(plain.step(tokens[:, t]), plain.xs.clone()) for t in range(tokens.shape[1])]
        static = Decoder(model, memory, batch=tokens.shape[0])
        static.start_full_ring()
        static.tokens.copy_(tokens[:, 0])
        with Replay() as recorded:
            first = static.full_ring_step()
        got = [(first.clone(), static.xs.clone())]
        for t in range(1, tokens.shape[1]):
            static.tokens.copy_(tokens[:, t])
            got.append((recorded.replay()[id(first)].clone(), static.xs.clone()))
    assert not [c for c in recorded.calls if c[0] in (torch.ops.aten._local_scalar_dense.default,
                                                      torch.ops.aten.item.default)]
    assert static.oldest.item() == tokens.shape[1] % cfg.mem_len
    # the same fp32 operations on the same values in both (equal here to the last bit); the wrong position rows or
    # slot move the logits by 3e-4 and the layers' outputs by 1.5e-3 to 3e-3 at this model's small initial weights
    for t, ((got_logits, got_xs), (want_logits, want_xs)) in enumerate(zip(got, want)):
        for name, a, b in (("logits", got_logits, want_logits), ("layer outputs", got_xs, want_xs)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda m: f"token {t}, {name}: {m}")


def test_full_ring_step_refuses_a_ring_not_full_and_graphs_need_cuda():
    model = Model(small(mem_len=4))
    with pytest.raises(RuntimeError, match="holds 0 of 4 slots"):
        Decoder(model).start_full_ring()
    with pytest.raises(ValueError, match="cuda_graph needs the model on a CUDA device"):
        Decoder(model, cuda_graph=True)


def test_decoder_cuda_graph_equals_plain_decoding(device):
    """On a GPU: Decoder(cuda_graph=True) from an empty ring (eager until full, then captured and replayed) against
    the plain decoder, 11 tokens with a ring of 4."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU (LANGUINI_TEST_DEVICE=cuda)")
    cfg = small(mem_len=4)
    model, tokens, _, _ = model_and_inputs(cfg, 11, dtype=torch.float32)
    model, tokens = model.to(device), tokens.to(device)
    with torch.no_grad():
        decoders = [Decoder(model, batch=tokens.shape[0], cuda_graph=graph) for graph in (False, True)]
        for t in range(tokens.shape[1]):
            want, got = (d.step(tokens[:, t]) for d in decoders)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"token {t}: {m}")
    assert decoders[1].graph is not None


def test_bad_configs_and_states_are_refused():
    with pytest.raises(ValueError, match="memory must be one of"):
        Model(small(memory="max"))
    with pytest.raises(ValueError, match="memory_layer"):
        Model(small(memory="layer", memory_layer=3))
    with pytest.raises(ValueError, match="attention_impl"):
        Model(small(attention_impl="flash"))
    with pytest.raises(ValueError, match="mem_len"):
        Model(small(mem_len=0))
    model = Model(small())
    with pytest.raises(ValueError, match="state must be the memory"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 5, 12))
    with pytest.raises(ValueError, match="state must be"):  # the decoder's batch is 2, the state's 3
        Decoder(model, torch.zeros(3, 4, 12), batch=2)


def test_kernel_named_before_the_model_moves_to_cuda(monkeypatch):
    """attention_impl='triton' is built on CPU (as every model is) without the interpreter, then moved to the GPU."""
    from projects.feedback.ops import window_attention

    monkeypatch.setattr(window_attention, "interpreting", lambda: False)
    Model(small(attention_impl="triton"))
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):  # its first forward on CPU says what is wrong
        window_attention.implementation("triton", torch.device("cpu"))


def test_configs_have_the_gpt_widths_of_table_4():
    from projects.gpt import configs as gpt_configs

    for name in ("mini", "tiny", "small", "medium"):
        ours, gpt = configs.get(name), gpt_configs.get(name)
        assert (ours.d_model, ours.n_layers, ours.n_heads, ours.d_head, ours.seq_len, ours.vocab_size) == \
            (gpt.d_model, gpt.n_layers, gpt.n_heads, gpt.d_head, gpt.seq_len, gpt.vocab_size)
    assert configs.COMPUTE_CLASSES == gpt_configs.COMPUTE_CLASSES


@pytest.mark.parametrize("name", ["cpu", "small"])
def test_parameter_count_against_the_gpt(name):
    """The GPT's parameters without its position table and per-layer keys and values, plus one shared key/value
    projection, its LayerNorm, the relative position table and the memory weights (counted by hand)."""
    from projects.gpt import configs as gpt_configs

    cfg = configs.get(name)
    gpt = gpt_configs.get(name)
    d, inner, L = gpt.d_model, gpt.n_heads * gpt.d_head, gpt.n_layers
    gpt_params = (gpt.vocab_size * d * 2 + gpt.seq_len * d + 2 * d
                  + L * (4 * d + 3 * inner * d + 3 * inner + inner * d + d + 2 * 4 * d * d + 4 * d + d))
    want = gpt_params - gpt.seq_len * d - L * 2 * (inner * d + inner) + 2 * inner * d + 2 * inner + 2 * d \
        + cfg.mem_len * cfg.d_head + L + 1
    with torch.device("meta"):
        model = Model(cfg)
    assert sum(p.numel() for p in model.parameters()) == want


def test_cuda_graph_replay_equals_eager_steps(device):
    """On a GPU: three training steps (a shape's first call eager, then capture, then replay) and evaluations with
    CUDA graphs against the same steps without, and a second forward before a backward refused."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU (LANGUINI_TEST_DEVICE=cuda)")
    cfg = small(mem_len=5, d_model=32, d_head=8, n_heads=4)
    models = []
    for graphs in (True, False):
        torch.manual_seed(0)
        models.append(Model(dataclasses.replace(cfg, cuda_graphs=graphs)).to(device))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    states = [None, None]
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        tokens = torch.randint(VOCAB, (3, 7), generator=g).to(device)
        results = []
        for i, (model, optimizer) in enumerate(zip(models, optimizers)):
            logits, states[i] = model(tokens, states[i])
            logits.square().mean().backward()
            results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
            optimizer.step()
            optimizer.zero_grad()
        torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
        for name, grad in results[1][1].items():
            torch.testing.assert_close(results[0][1][name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        with torch.no_grad():
            torch.testing.assert_close(models[0](tokens, states[0])[0], models[1](tokens, states[1])[0],
                                       rtol=1e-5, atol=1e-5)
    first, _ = models[0](tokens, states[0])
    models[0](tokens, states[0])
    with pytest.raises(RuntimeError, match="backward must follow its own forward"):
        first.sum().backward()
