"""A project's configs against a baseline's of the same size: parameters and forward FLOPs, as a markdown table.

    python scripts/size_table.py peer_gpt --baseline gpt --configs cpu mini tiny small medium small_paper \\
        --fields peer_n_keys peer_heads peer_knn

Forward FLOPs at batch 1 and each config's seq_len and vocabulary, as the Languini paper counts them (DeepSpeed's
profiler plus the model's extra_flops, languini/flops.py), on the meta device: no memory, seconds a config. A config
is compared with the baseline's config of the same name, else with the one its name starts with (`small_paper`:
`small`). What the ratio should be is for the project's README, not for this script.
"""
import importlib

import torch

from languini import flops
from languini.flags import Parser


def load(project):
    return (importlib.import_module(f"projects.{project}.configs"),
            importlib.import_module(f"projects.{project}.model").Model)


def baseline_name(name: str, baseline_configs) -> str:
    """The baseline's config of the same size: the same name, else the part before the first '_'."""
    if name in baseline_configs.SIZES:
        return name
    size = name.split("_")[0]
    if size not in baseline_configs.SIZES:
        raise SystemExit(f"no baseline config for {name!r}: neither it nor {size!r} is one")
    return size


def sizes(configs, model_cls, name):
    """(parameters, forward FLOPs) of a named config."""
    cfg = configs.get(name)
    with torch.device("meta"):
        model = model_cls(cfg)
        return (sum(p.numel() for p in model.parameters()),
                flops.forward_flops(model, cfg.seq_len, cfg.vocab_size, "meta"))


def main(argv=None):
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("project", help="the project whose configs are listed (projects/<project>)")
    parser.add_argument("--baseline", default="gpt", help="the project compared with")
    parser.add_argument("--configs", nargs="+", required=True, help="the project's configs to list")
    parser.add_argument("--fields", nargs="*", default=[], help="config fields shown as columns")
    args = parser.parse_args(argv)
    configs, model_cls = load(args.project)
    baseline_configs, baseline_cls = load(args.baseline)
    unknown = [name for name in args.configs if name not in configs.SIZES]
    if unknown:
        raise SystemExit(f"unknown {args.project} configs {unknown}; choose among {', '.join(configs.SIZES)}")
    print(f"| config | {' | '.join(args.fields)}{' | ' if args.fields else ''}parameters | {args.baseline} | "
          f"forward GFLOPs | {args.baseline}'s | ratio |")
    print("|---|" + "---:|" * (len(args.fields) + 5))
    for name in args.configs:
        params, model_flops = sizes(configs, model_cls, name)
        base_params, base_flops = sizes(baseline_configs, baseline_cls, baseline_name(name, baseline_configs))
        values = [f"{getattr(configs.get(name), field):,}" for field in args.fields]
        print(f"| {name} | {' | '.join(values)}{' | ' if values else ''}{params / 1e6:.1f}M | "
              f"{base_params / 1e6:.1f}M | {model_flops / 1e9:.2f} | {base_flops / 1e9:.2f} | "
              f"{model_flops / base_flops:.4f} |", flush=True)


if __name__ == "__main__":
    main()
