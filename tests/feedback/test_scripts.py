"""The project's scripts: the GPT copy of gpt_baseline.py against projects/gpt/model.py and its cached generation
against its forward; bench_speed.py's table; the random walks of toy_task.py against a hand-worked walk, and the
task's script end to end on a tiny budget."""
import torch

from projects.feedback import bench_speed, configs, toy_task
from projects.feedback.gpt_baseline import GPT, CachedDecoder, GPTConfig


def test_gpt_copy_equals_the_gpt_project():
    from projects.gpt import configs as gpt_configs
    from projects.gpt.model import Model as OriginalGPT

    for attention in ("math", "sdpa"):
        cfg = bench_speed.gpt_config(configs.get("cpu", n_layers=1, seq_len=16), attention)
        torch.manual_seed(0)
        original = OriginalGPT(gpt_configs.ModelConfig(**vars(cfg)))
        torch.manual_seed(0)
        copy = GPT(cfg)
        assert copy.state_dict().keys() == original.state_dict().keys()
        copy.load_state_dict(original.state_dict())
        tokens = torch.randint(cfg.vocab_size, (2, 16))
        with torch.no_grad():
            # the same weights through two copies of the code: fp32 tolerance (a kernel may differ by machine)
            torch.testing.assert_close(copy(tokens)[0], original(tokens)[0], rtol=1e-5, atol=1e-5)


def test_cached_generation_equals_the_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, seq_len=9, d_model=32, n_layers=2, n_heads=2, d_head=16)).eval()
    tokens = torch.randint(50, (3, 9))
    with torch.no_grad():
        want = model(tokens)[0]
        decoder = CachedDecoder(model, batch=3)
        got = torch.stack([decoder.step(tokens[:, t]) for t in range(9)], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bench_prints_both_models_with_their_ratios(capsys, single_thread):
    rows = bench_speed.main(["--config", "cpu", "--steps", "1", "--warmup", "0", "--batch_size", "2",
                             "--gen_tokens", "3", "--repeats", "1"])
    assert [r["model"] for r in rows] == ["gpt sdpa", "gpt math", "feedback"]
    assert rows[0]["train_ratio"] == 1 and rows[2]["train_tokens_per_second"] > 0
    assert rows[2]["generate_ratio"] > 0 and rows[1]["generate_tokens_per_second"] is None
    assert "vs gpt sdpa" in capsys.readouterr().out


def test_walks_against_a_hand_worked_walk():
    tokens, cells = toy_task.walks(1, 6, 3, torch.Generator().manual_seed(0))
    # 3 x 3 grid: start cell 8 = (2, 2) (token 4 + 8); west to (2, 1) = 7; south into the wall, still 7; north to
    # (1, 1) = 4; west to (1, 0) = 3; west into the wall, still 3. Cells are tokens 4 + cell.
    assert tokens[0].tolist() == [12, 3, 1, 0, 3, 3]
    assert cells[0].tolist() == [12, 11, 11, 8, 7, 7]


def test_toy_task_runs_both_models(single_thread, tmp_path):
    results = toy_task.main(["--seconds", "0.5", "--length", "6", "--grid", "3", "--d_model", "16", "--n_heads", "2",
                             "--eval_walks", "500", "--batch_size", "8", "--plot", str(tmp_path / "walk.png")])
    assert (tmp_path / "walk.png").stat().st_size > 0
    assert set(results) == {"feedback", "gpt"}
    for r in results.values():
        assert r["steps"] >= 1 and 0 <= r["last_step_accuracy"] <= 1 and 0 <= r["accuracy"] <= 1
