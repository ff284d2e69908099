"""A layer whose parameters are split over processes (languini.model_parallel) against the same layer whole on one
process, run on every rank of a gloo group (tests/distributed.py): the same initial numbers, outputs (and
auxiliary losses), every gradient, and one Adam step after the trainer's gradient averaging and global-norm clip.

build(shards) -> the layer (drawn from one seed) split over `shards`, or whole for model_parallel.WHOLE;
tokens(rank) -> (x, grad_out): rank `rank`'s inputs and the gradient of its outputs, which any process can draw.
The layer returns its output or (output, auxiliary losses); the objective of a rank is (output * grad_out).sum()
plus its auxiliary losses. A split parameter's gradient is the sum over the ranks' objectives (its part); a copied
one's is the rank's own (DDP averages them in training).
"""
import torch
import torch.distributed as dist

from languini import model_parallel

MAX_NORM = 1.0  # a clip that bites
# Adam's first step is lr * g / (|g| + eps): with the default eps (1e-8) a gradient element that cancels to ~1e-8
# (a sub-key just outside the top k) turns float noise into a visible step; 1e-4 keeps the step smooth there.
ADAM_EPS = 1e-4


def run(module, x, grad_out):
    """Output, auxiliary losses, and the gradients of the objective by parameter name and for the input."""
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    result = module(x)
    out, aux = result if isinstance(result, tuple) else (result, {})
    ((out * grad_out).sum() + sum(aux.values())).backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    return out.detach(), {k: v.detach() for k, v in aux.items()}, grads, x.grad


def check_split_layer(rank: int, world_size: int, build, tokens, tolerance: dict, what: str = "") -> None:
    shards = model_parallel.shard_group(world_size, "the test's group")
    split, whole = build(shards), build(model_parallel.WHOLE)
    parts = {name: model_parallel.sharding(p) for name, p in split.named_parameters()}
    assert any(parts.values()), "nothing is split"
    for (name, p), ref in zip(split.named_parameters(), whole.parameters(), strict=True):
        expected = model_parallel.local_part(ref, parts[name]) if parts[name] else ref
        assert torch.equal(p, expected), f"{name} starts from other numbers than the whole layer's ({what})"

    out, aux, grads, x_grad = run(split, *tokens(rank))
    references = [run(whole, *tokens(r)) for r in range(world_size)]
    ref_out, ref_aux, ref_grads, ref_x_grad = references[rank]
    torch.testing.assert_close(out, ref_out, **tolerance, msg=lambda m: f"output ({what}): {m}")
    torch.testing.assert_close(aux, ref_aux, **tolerance, msg=lambda m: f"auxiliary losses ({what}): {m}")
    torch.testing.assert_close(x_grad, ref_x_grad, **tolerance, msg=lambda m: f"input gradient ({what}): {m}")
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        expected = (model_parallel.local_part(sum(r[2][name] for r in references), parts[name]) if parts[name]
                    else ref_grads[name])
        torch.testing.assert_close(grad, expected, **tolerance, msg=lambda m: f"gradient of {name} ({what}): {m}")

    # one step as the trainer takes it: copied gradients averaged (DDP), split ones finished, the clip, Adam
    for name, p in split.named_parameters():
        p.grad = grads[name].clone()
        if not parts[name]:
            dist.all_reduce(p.grad)
            p.grad /= world_size
    model_parallel.finish_gradients([p for name, p in split.named_parameters() if parts[name]], world_size)
    norm = model_parallel.clip_grad_norm_(split.parameters(), MAX_NORM)
    for name, p in whole.named_parameters():
        p.grad = sum(r[2][name] for r in references) / world_size
    ref_norm = torch.nn.utils.clip_grad_norm_(whole.parameters(), MAX_NORM)
    torch.testing.assert_close(norm, ref_norm, **tolerance)
    assert ref_norm > 2 * MAX_NORM, f"the clip does not bite ({what})"
    for module in (split, whole):
        torch.optim.Adam(module.parameters(), lr=1e-2, eps=ADAM_EPS).step()
    for (name, p), ref in zip(split.named_parameters(), whole.parameters()):
        expected = model_parallel.local_part(ref, parts[name]) if parts[name] else ref
        torch.testing.assert_close(p, expected, **tolerance, msg=lambda m: f"{name} after the step ({what}): {m}")
