"""scripts/bench_activation_memory.py: the bytes kept for the backward, counted with and without checkpointed
blocks, against a hand count for one linear layer."""
import torch

from languini.experiment import REPO_ROOT
from tests.core.test_throughput import load_script


def test_kept_bytes_counts_what_autograd_saves():
    script = load_script("bench_activation_memory")

    class Linear(torch.nn.Module):  # a language model of one linear layer: saves its input (8 x 16 fp32)
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32)

        def forward(self, x, state=None):
            return self.head(self.embed(x)), None

    x = torch.randint(32, (1, 9))
    # 8 positions. embedding: its int64 indices (8 x 8 bytes); head: its input (8 x 16 x 4) and weight (32 x 16 x
    # 4); log_softmax: its output (8 x 32 x 4); nll_loss: that output again, the targets (8 x 8) and its total
    # weight (a float32 scalar)
    assert script.kept_bytes(Linear(), x) == 8 * 8 + (8 * 16 + 32 * 16) * 4 + 2 * 8 * 32 * 4 + 8 * 8 + 4


def test_checkpointed_blocks_keep_less(capsys):
    script = load_script("bench_activation_memory")
    [row] = script.main(["--models", "gpt:cpu", "--seq_len", "128", "--vocab_size", "2048"])
    assert 0 < row["checkpointed"] < row["kept"] / 2
    assert "gpt:cpu" in capsys.readouterr().out
    assert (REPO_ROOT / "scripts" / "README.md").read_text().count("bench_activation_memory.py") >= 1
