"""A Switch layer with its experts split over 2 processes (gloo), tokens sent to their expert's process and back,
against the same layer with every expert on one process (tests/split_layer.py): initial weights, outputs,
auxiliary losses, every gradient and one Adam step; top-1 and top-2 routing with tokens dropped for capacity, the
local experts run by the loop and by the grouped Triton kernel, the processes routing different numbers of tokens
(the counts are exchanged first)."""
from dataclasses import replace

import pytest
import torch

from projects.switch_gpt import configs
from projects.switch_gpt.model import SwitchMLP
from tests.distributed import run_on_ranks
from tests.split_layer import check_split_layer

CONFIG = configs.ModelConfig(d_model=16, mlp_ratio=2, n_experts=4, capacity_factor=1.0, router_z_coef=1e-3)
TOKENS = (12, 7)  # capacity 3 and 1 per expert at top-1: tokens are dropped
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # fp32 GEMMs of 16 and 32 terms in other row orders


def tokens(rank: int):
    generator = torch.Generator().manual_seed(300 + rank)
    return (torch.randn(TOKENS[rank], CONFIG.d_model, generator=generator),
            torch.randn(TOKENS[rank], CONFIG.d_model, generator=generator))


def check(rank: int, world_size: int) -> None:
    for impl in ("naive", "triton"):
        for routing in ("top1", "top2"):
            def build(shards):
                torch.manual_seed(0)
                layer = SwitchMLP(replace(CONFIG, routing=routing, experts_impl=impl, expert_parallel=shards.size))
                layer.init_weights()
                return layer

            check_split_layer(rank, world_size, build, tokens, TOLERANCE, f"{routing}, {impl}")
    layer = SwitchMLP(replace(CONFIG, expert_parallel=world_size))
    layer.init_weights()
    layer(tokens(rank)[0])
    if rank == 1:  # 7 tokens for 4 experts of 1 slot each: capacity dropped some
        assert layer.train_dropped >= 3


def test_experts_split_over_processes_match_one_process():
    run_on_ranks(check, 2)


def test_bad_expert_parallel_is_refused():
    with pytest.raises(ValueError, match="expert_parallel must be at least 1 and divide n_experts"):
        configs.get("cpu", expert_parallel=3)
