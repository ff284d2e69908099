"""What the tests of the GPTs with a memory layer share (lram_gpt, pkm_gpt, peer_gpt, ultramem_gpt): the GPT's
parameters counted by hand, the causality check with a counterexample, a few steps of Adam on one batch, a smoke run
of the trainer, and a layer's reference path against its Triton path."""
import json
import math

import torch

from languini import experiment


def gpt_parameters(V, S, d, L, H, d_head, r):
    """GPT-2 style decoder with learned positions, untied output layer, biases in every linear but the head."""
    inner = H * d_head
    attention = d * 3 * inner + 3 * inner + inner * d + d
    block = 2 * 2 * d + attention + mlp_parameters(d, r)
    return V * d + S * d + L * block + 2 * d + d * V


def mlp_parameters(d, r):
    return d * r * d + r * d + r * d * d + d


def earlier_logits_unchanged(model, vocab_size: int) -> bool:
    """Whether the logits of the first 7 of 12 tokens stay (within 1e-6) when every later token changes: a causal
    model's do; a batch norm's statistics carry later tokens back."""
    x = torch.randint(vocab_size, (2, 12))
    changed = x.clone()
    changed[:, 7:] = (x[:, 7:] + 1 + torch.randint(vocab_size - 2, (2, 5))) % vocab_size  # every later token differs
    earlier, earlier_changed = model(x)[0][:, :7], model(changed)[0][:, :7]
    return torch.allclose(earlier, earlier_changed, rtol=0, atol=1e-6)


def losses_on_one_batch(model, vocab_size: int, steps: int = 15, lr: float = 3e-3) -> list[float]:
    """The next-token losses of `steps` steps of Adam on one random batch of 4 x 16 tokens."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    x = torch.randint(vocab_size, (4, 16))
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1])[0].flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def smoke_run_results(project: str, configs, model_cls, corpus_root, out_dir, memory_rows: int) -> dict:
    """results.json of a 3-step run of the project's cpu config through experiment.main (train.py's path), after
    checking what every memory GPT's run holds: its steps, and per split of the fast evaluation the memory's read
    statistics (usage in (0, 1], KL from uniform in [0, ln memory_rows])."""
    # --config cpu: without it a machine with a GPU picks the small config.
    argv = ["--config", "cpu", "--max_steps", "3", "--batch_size", "4", "--seq_len", "64", "--eval_every", "3",
            "--eval_batch_size", "4", "--eval_max_batches", "2", "--slow_eval_max_windows", "2",
            "--data_root", str(corpus_root), "--out_dir", str(out_dir), "--run_name", "smoke"]
    experiment.main(project, configs, model_cls, argv=argv)
    results = json.loads((out_dir / "smoke" / "results.json").read_text())
    assert results["project"] == project and results["config"] == "cpu" and results["steps"] == 3
    assert results["memory_stats"].keys() == results["eval"]["fast"].keys()
    for stats in results["memory_stats"].values():
        assert 0 < stats["memory_usage"] <= 1
        assert 0 <= stats["kl_from_uniform"] <= math.log(memory_rows)
    return results


def reference_and_triton_runs(layer, x, device, switches=("use_triton",)):
    """(output, input gradient, {parameter: gradient}) of the layer on its reference path and on its Triton path
    (the layer's boolean attributes `switches` all False, then all True), each run on `device` after a
    sum-of-outputs backward, returned on the CPU; the layer is left on the CPU."""
    runs = []
    for use_triton in (False, True):
        for switch in switches:
            setattr(layer, switch, use_triton)
        layer.zero_grad()
        inputs = x.to(device).requires_grad_()
        out = layer.to(device)(inputs)
        out.backward(torch.ones_like(out))
        grads = {name: p.grad.to_dense().cpu() for name, p in layer.named_parameters()}
        runs.append((out.detach().cpu(), inputs.grad.cpu(), grads))
        layer.cpu()
    return runs


def assert_runs_close(run, other, tol):
    """The outputs, input gradients and every parameter's gradient of two runs equal within rtol = atol = tol."""
    (out, grad_x, grads), (out_o, grad_x_o, grads_o) = run, other
    torch.testing.assert_close(out_o, out, rtol=tol, atol=tol)
    torch.testing.assert_close(grad_x_o, grad_x, rtol=tol, atol=tol)
    assert grads_o.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_o[name], grads[name], rtol=tol, atol=tol, msg=name)
