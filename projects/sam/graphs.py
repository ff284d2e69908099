"""SAM's training time loop captured in CUDA graphs (`cuda_graph`; CUDA with exact search only). UNVERIFIED: no
GPU was at hand when it was written, so it is off by default; tests/sam/test_device.py holds its check against the
eager loop, which runs where CUDA is.

A segment's T steps launch thousands of small kernels from Python; replaying them from a graph costs one launch
each way. The loop can be captured because a step has fixed shapes and reads nothing on the host
(tests/sam/test_device.py), and because its backward, the memory's rollback included (memory.py), is a fixed
sequence of kernels on tensors the forward made: torch.cuda.make_graphed_callables captures the forward and the
autograd backward of `TimeLoop` once and replays them per call. The state's tensors are copied into the graph's
own buffers before a replay and the ones the loop changes in place (the memory, the usage, the links) back into
the state's tensors after it, so a caller sees what the eager loop does. The saved activations live in the graph's
memory until the next replay, so a backward must follow its own forward: `generation` counts replays and the
backward refuses one that another replay overwrote.
"""
import torch
import torch.nn as nn


class TimeLoop(nn.Module):
    """core.time_loop as a module of (input_gates, *the state's tensors in `keys` order), returning tensors only:
    (outputs, reads, token, *the state's tensors the loop replaced, in `replaced` order). Its parameters are the
    core's."""

    def __init__(self, core, keys: tuple):
        super().__init__()
        self.core, self.keys, self.replaced = core, keys, None

    def forward(self, input_gates, *tensors):
        state = dict(zip(self.keys, tensors))
        hs, reads, token = self.core.time_loop(input_gates, state, recording=True)
        replaced = tuple(k for k, v in zip(self.keys, tensors) if state[k] is not v)
        if self.replaced is None:
            self.replaced = replaced
        elif replaced != self.replaced:
            raise RuntimeError(f"the time loop replaced {replaced} of the state, before {self.replaced}")
        return (hs, reads, token, *(state[k] for k in replaced))


class CapturedLoop:
    """The time loop of one shape (input, state, autocast), captured at construction and replayed per call."""

    def __init__(self, core, input_gates: torch.Tensor, state: dict):
        self.keys = tuple(state)
        self.static = [v.detach().clone() for v in state.values()]
        self.loop = TimeLoop(core, self.keys)
        gates = input_gates.detach().clone().requires_grad_(True)
        # make_graphed_callables refuses autocast's weight cache; the same autocast without it is captured
        with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"),
                             cache_enabled=False):
            self.graphed = torch.cuda.make_graphed_callables(self.loop, (gates, *self.static),
                                                             allow_unused_input=True)
        # the dL/dM buffer the captured backward uses: kept alive even if the core's GradientBuffers moves on
        self.gradient_buffers = dict(core.gradient_buffers.buffers)
        self.generation = 0

    def __call__(self, input_gates: torch.Tensor, state: dict):
        """Replay on input_gates and state (updated as the eager loop does); returns (outputs, reads, token)."""
        hs, reads, token, *replaced = self.graphed(input_gates, *(state[k] for k in self.keys))
        self.generation += 1
        for key, static in zip(self.keys, self.static):
            if key not in self.loop.replaced:  # changed in place by the loop
                state[key].copy_(static)
        state.update(zip(self.loop.replaced, (v.clone() for v in replaced)))  # the next replay overwrites them
        return hs, reads, SameGeneration.apply(token, self, self.generation)


class SameGeneration(torch.autograd.Function):
    """The token unchanged; its backward refuses to run once another replay overwrote the saved activations."""

    @staticmethod
    def forward(ctx, token, captured: CapturedLoop, generation: int):
        ctx.captured, ctx.generation = captured, generation
        return token.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.captured.generation != ctx.generation:
            raise RuntimeError("with cuda_graph, a segment's backward must follow its own forward (another forward "
                               "of the same shape ran in between); set cuda_graph false for this use")
        return grad, None, None
