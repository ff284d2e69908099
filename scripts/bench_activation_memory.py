"""What activation checkpointing saves: the bytes a training forward keeps for its backward, with and without it.

    python scripts/bench_activation_memory.py                          # GPT small and mini, one sequence of 512
    python scripts/bench_activation_memory.py --models gpt:cpu lram_gpt:cpu --seq_len 128

Counts every tensor autograd saves during one forward of one sequence (torch.autograd.graph.saved_tensors_hooks,
fp32, eager PyTorch path on this machine), once as the model is and once with --activation_checkpointing's
blocks (languini/parallelize.py), where a block keeps only its input. A count, not a timing: the machine's load
does not change it. Tensors that several operations save are counted each time (the bytes held can be fewer).
"""
import argparse
import importlib

import torch
import torch.nn.functional as F

from languini import parallelize
from languini.flags import Parser


def kept_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors one training forward of x keeps for the backward (then runs the backward)."""
    kept = 0

    def pack(t):
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x[:, :-1], None)[0]
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    return kept


def main(argv=None) -> list[dict]:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gpt:mini", "gpt:small"], help="PROJECT:CONFIG")
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--vocab_size", type=int, default=16384, help="the books' vocabulary (the output layer's share)")
    args = p.parse_args(argv)
    rows = []
    print(f"{'model':<18}{'layers':>7}{'kept, MiB':>12}{'checkpointed, MiB':>19}{'ratio':>8}")
    for spec in args.models:
        project, config = spec.split(":")
        configs = importlib.import_module(f"projects.{project}.configs")
        cfg = configs.get(config, seq_len=args.seq_len, vocab_size=args.vocab_size)
        model_cls = importlib.import_module(f"projects.{project}.model").Model
        torch.manual_seed(0)
        x = torch.randint(cfg.vocab_size, (1, args.seq_len + 1))
        plain = kept_bytes(model_cls(cfg).train(), x)
        model = model_cls(cfg).train()
        parallelize.checkpoint_activations(model)
        checkpointed = kept_bytes(model, x)
        rows.append({"model": spec, "layers": cfg.n_layers, "kept": plain, "checkpointed": checkpointed})
        print(f"{spec:<18}{cfg.n_layers:>7}{plain / 2 ** 20:>12.1f}{checkpointed / 2 ** 20:>19.1f}"
              f"{checkpointed / plain:>8.3f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
