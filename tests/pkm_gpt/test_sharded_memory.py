"""The product-key memory with its value table split by columns over 2 processes (gloo) against the whole table
on one process (tests/split_layer.py): initial values, outputs, every gradient and one Adam step; with and without
the Memory+ gate, the processes reading different numbers of tokens (the layer exchanges the counts)."""
import torch

from projects.pkm_gpt.pkm import ProductKeyMemory
from tests.distributed import run_on_ranks
from tests.split_layer import check_split_layer

WIDTH = 32  # the value width too: 16 columns per process
TOKENS = (5, 3)
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # fp32 sums of 2 heads x 4 softmax-weighted values


def tokens(rank: int):
    generator = torch.Generator().manual_seed(200 + rank)
    return torch.randn(TOKENS[rank], WIDTH, generator=generator), torch.randn(TOKENS[rank], WIDTH, generator=generator)


def check(rank: int, world_size: int) -> None:
    for gate in ("none", "silu"):
        def build(shards):
            torch.manual_seed(0)
            return ProductKeyMemory(WIDTH, heads=2, k_dim=8, n_keys=16, knn=4, use_triton=False, gate=gate,
                                    shards=shards)

        check_split_layer(rank, world_size, build, tokens, TOLERANCE, f"gate {gate}")


def test_split_value_table_matches_the_whole_table():
    run_on_ranks(check, 2)
