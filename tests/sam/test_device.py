"""A training step of the SAM language model never reads a tensor on the host (issue 46 item 4): with exact search
its time loop runs on the memory's device from end to end, so a GPU never waits for the CPU between steps.

On the CPU no copy to the host can be seen, so the test makes every Python-level read of a tensor's values raise
(item, tolist, int, float, bool, numpy, index) while a forward and backward of a small model run; on CUDA it also
turns on torch's sync debug mode, which raises at any synchronising call (a copy to the host, a nonzero)."""
import contextlib

import pytest
import torch

from projects.sam import configs, graphs
from projects.sam.model import Model

HOST_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "numpy")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class HostRead(RuntimeError):
    pass


@contextlib.contextmanager
def no_host_reads(monkeypatch, device: str):
    """Within: any of HOST_READS on a tensor raises HostRead; on CUDA, a synchronising call raises too."""
    with monkeypatch.context() as patch:
        for name in HOST_READS:
            def refuse(self, *args, _name=name, **kwargs):
                raise HostRead(f"Tensor.{_name} read a tensor on the host inside a training step")

            patch.setattr(torch.Tensor, name, refuse)
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")


def training_step(model, x, state):
    logits, state = model(x, state)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    return state


def test_the_guard_catches_host_reads(monkeypatch):
    """The guard itself: each way of reading a value on the host raises inside it, and works again after it."""
    t = torch.ones(2)
    reads = [lambda: t[0].item(), lambda: t.tolist(), lambda: int(t[0]), lambda: float(t[0]),
             lambda: bool(t[0]), lambda: [0, 1][t[0].long()], lambda: t.numpy()]
    with no_host_reads(monkeypatch, "cpu"):
        for read in reads:
            with pytest.raises(HostRead):
                read()
    assert t.tolist() == [1.0, 1.0] and bool(t[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sam", "sdnc"])
def test_a_training_step_reads_nothing_on_the_host(kind, device, monkeypatch):
    """Two segments of forward and backward (a fresh state, then a carried one) of SAM and the Sparse DNC with
    exact search, with host reads refused; on CUDA after a warm-up segment (first launches compile kernels)."""
    torch.manual_seed(0)
    model = Model(configs.get("cpu", kind=kind, words=32, hidden=16, d_model=16, seq_len=6)).to(device)
    x = torch.randint(model.cfg.vocab_size, (2, 6), device=device)
    state = training_step(model, x, None) if device == "cuda" else None
    with no_host_reads(monkeypatch, device):
        state = training_step(model, x, state)
        state = training_step(model, x, state)
    assert all(p.grad is not None for p in model.parameters())
    assert state["memory"].abs().sum() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("kind", ["sam", "sdnc"])
def test_cuda_graph_replay_equals_the_eager_loop(kind):
    """Five training segments with cuda_graph on (a shape's first runs eagerly, the second captures and replays,
    the rest replay) against the same with it off: the losses, every gradient and the carried memory, usage and
    links. fp32, so the two differ only by the order of the kernels' own reductions."""
    runs = []
    for graphed in (False, True):
        torch.manual_seed(0)
        model = Model(configs.get("cpu", kind=kind, words=64, hidden=32, d_model=32, seq_len=12,
                                  cuda_graph=graphed)).cuda()
        g = torch.Generator(device="cuda").manual_seed(1)
        state, losses, grads = None, [], []
        for _ in range(5):
            x = torch.randint(model.cfg.vocab_size, (3, 12), device="cuda", generator=g)
            model.zero_grad()
            logits, state = model(x, state)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
            loss.backward()
            losses.append(loss.detach())
            grads.append([p.grad.clone() for p in model.parameters()])
        runs.append((torch.stack(losses), grads, state))
    (eager_losses, eager_grads, eager_state), (losses, grads, state) = runs
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for step_grads, eager_step_grads in zip(grads, eager_grads):
        for got, want in zip(step_grads, eager_step_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert state.keys() == eager_state.keys()
    for key in state:
        torch.testing.assert_close(state[key], eager_state[key], rtol=1e-5, atol=1e-6)


def graph_stand_in(module, sample_args, **kwargs):
    """make_graphed_callables as the CapturedLoop sees it, on the CPU: every call copies the state's tensors into the
    sample arguments (the graph's static inputs) and runs the module on those (no graph; gradients flow to the
    caller's input_gates directly, as the graph returns them)."""
    def run(input_gates, *tensors):
        with torch.no_grad():
            for static, given in zip(sample_args[1:], tensors):
                static.copy_(given)
        return module(input_gates, *sample_args[1:])

    return run


@pytest.mark.parametrize("kind", ["sam", "sdnc"])
def test_the_captured_loop_updates_the_state_as_the_eager_loop(kind, monkeypatch):
    """graphs.CapturedLoop on the CPU with a stand-in for the graphs (graph_stand_in): the state's copies in and
    out of the static buffers give, over five segments (the last three through the CapturedLoop), the eager
    loop's losses, gradients and carried state exactly; a backward after a later replay is refused."""
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", graph_stand_in)
    runs = []
    for captured in (False, True):
        torch.manual_seed(0)
        model = Model(configs.get("cpu", kind=kind, words=32, hidden=16, d_model=16, seq_len=6))
        loops = []

        def captured_loop(input_gates, state, model=model, loops=loops):
            if len(loops) < 2:
                loops.append(None)
                return None
            if len(loops) == 2:
                loops.append(graphs.CapturedLoop(model.core, input_gates, state))
            return loops[-1]

        if captured:
            monkeypatch.setattr(model.core, "captured_loop", captured_loop)
        g = torch.Generator().manual_seed(1)
        state, grads = None, []
        for _ in range(5):
            x = torch.randint(model.cfg.vocab_size, (2, 6), generator=g)
            model.zero_grad()
            state = training_step(model, x, state)
            grads.append([p.grad.clone() for p in model.parameters()])
        runs.append((grads, state))
    (eager_grads, eager_state), (grads, state) = runs
    for step_grads, eager_step_grads in zip(grads, eager_grads):
        for got, want in zip(step_grads, eager_step_grads):
            assert torch.equal(got, want)
    assert state.keys() == eager_state.keys()
    assert all(torch.equal(state[k], eager_state[k]) for k in state)
    first, state = model(x, state)
    model(x, state)
    with pytest.raises(RuntimeError, match="must follow its own forward"):
        first.sum().backward()
