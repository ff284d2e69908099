"""The configs of peer_gpt against the GPT's of the same name: parameters and forward FLOPs, the table of README.md.

    python projects/peer_gpt/size_table.py            # cpu, mini, tiny, small, medium and the *_paper configs

Forward FLOPs at batch 1 and each config's seq_len and vocabulary, as the Languini paper counts them (DeepSpeed's
profiler plus the model's extra_flops, languini/flops.py), on the meta device: no memory, a few seconds a config.
"""
import torch

from languini import flops
from languini.flags import Parser
from projects.gpt import configs as gpt_configs
from projects.gpt.model import Model as GPT
from projects.peer_gpt import configs
from projects.peer_gpt.model import Model

DEFAULT_CONFIGS = ("cpu", "mini", "tiny", "small", "medium", "mini_paper", "tiny_paper", "small_paper",
                   "medium_paper")


def gpt_name(name: str) -> str:
    """The GPT config a peer_gpt config is compared with: the same size."""
    return name.removesuffix("_paper")


def row(name: str) -> dict:
    """Sizes of the peer_gpt config `name` and of the GPT of the same size."""
    cfg, gpt_cfg = configs.get(name), gpt_configs.get(gpt_name(name))
    with torch.device("meta"):
        model, gpt = Model(cfg), GPT(gpt_cfg)
        model_flops = flops.forward_flops(model, cfg.seq_len, cfg.vocab_size, "meta")
        gpt_flops = flops.forward_flops(gpt, gpt_cfg.seq_len, gpt_cfg.vocab_size, "meta")
    experts = sum(p.numel() for layer in model.memories for p in layer.expert_parameters())
    return dict(config=name, experts=cfg.peer_n_keys ** 2, heads=cfg.peer_heads, knn=cfg.peer_knn,
                active=cfg.peer_heads * cfg.peer_knn, params=sum(p.numel() for p in model.parameters()),
                expert_params=experts, gpt_params=sum(p.numel() for p in gpt.parameters()), flops=model_flops,
                gpt_flops=gpt_flops, ratio=model_flops / gpt_flops)


def main(argv=None):
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=list(configs.SIZES),
                        help="peer_gpt configs to list")
    args = parser.parse_args(argv)
    print("| config | experts N | heads h | k | active hk | parameters | of them experts | GPT | forward GFLOPs "
          "| GPT's | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.configs:
        r = row(name)
        print(f"| {r['config']} | {r['experts']:,} | {r['heads']} | {r['knn']} | {r['active']} | "
              f"{r['params'] / 1e6:.1f}M | {r['expert_params'] / 1e6:.1f}M | {r['gpt_params'] / 1e6:.1f}M | "
              f"{r['flops'] / 1e9:.2f} | {r['gpt_flops'] / 1e9:.2f} | {r['ratio']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
