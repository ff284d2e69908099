"""projects/compressive/bench_attention_memory.py runs on CPU and prints a row per layer, memory and mode (Triton:
GPU only); its GPT rows time languini/transformer.py's attention, pinned by tests/core/test_transformer.py."""
from projects.compressive import bench_attention_memory as bench


def test_bench_prints_a_row_per_layer_memory_and_mode(capsys, single_thread):
    bench.main(["--d_model", "32", "--n_heads", "2", "--d_head", "16", "--seq_len", "16", "--memories", "0", "8",
                "--batch_size", "1", "--repeats", "1", "--warmup", "0"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("gpt", "compressive"))]
    expected = [(layer, memory, mode) for mode in ("fwd", "fwd+bwd")
                for layer, memory in [("math", "0"), ("sdpa", "0")]
                + [(impl, memory) for memory in ("0", "8") for impl in ("naive", "triton", "flex")]]
    assert [(row[1], row[2], row[3]) for row in rows] == expected
    assert all(row[4] == "-" for row in rows if row[1] == "triton")  # not timed on CPU
    assert rows[0][6] == "1.00"  # the GPT math layer is the reference
