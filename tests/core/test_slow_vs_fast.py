"""scripts/slow_vs_fast.py: per-target losses that add up to the evaluator's, and no difference at full context."""
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from languini import checkpoint
from languini.books import BooksDataset
from languini.evaluation import Evaluator
from projects.gpt import configs as gpt_configs
from projects.gpt.model import Model as GPT
from projects.qlstm import configs as qlstm_configs
from projects.qlstm.model import Model as QLSTM

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("slow_vs_fast", REPO / "scripts" / "slow_vs_fast.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_made_run(run_dir, project, model, cfg, dataset_dir, slow_eval="every_target"):
    run_dir.mkdir()
    checkpoint.save(run_dir, {"model": model.state_dict(), "model_config": dataclasses.asdict(cfg)})
    (run_dir / "results.json").write_text(json.dumps({"project": project, "dataset": str(dataset_dir),
                                                      "train_config": {"slow_eval": slow_eval}}))


def test_losses_add_up_to_the_evaluators_and_full_context_targets_agree(script, default_corpus_root, tmp_path,
                                                                          single_thread, capsys):
    torch.manual_seed(0)
    cfg = gpt_configs.get("cpu", d_model=32, n_layers=1, n_heads=2, d_head=16, seq_len=32)
    model = GPT(cfg).eval()
    hand_made_run(tmp_path / "run", "gpt", model, cfg, default_corpus_root / "books_2048")
    fast, slow = script.main([str(tmp_path / "run"), "--split", "test"])
    assert "slow - side by side" in capsys.readouterr().out

    # the evaluator's own windows: one stream side by side (the fast eval at batch 1), and the slow eval
    books = BooksDataset(default_corpus_root, 2048).books("test")
    def evaluator(batch_size):  # batch 1: the fast eval reads the split as one stream
        return Evaluator(torch.ones(2048), 2048, cfg.seq_len, torch.device("cpu"), batch_size, max_batches=None,
                         slow_protocol="every_target")
    side_by_side = evaluator(1).fast(model, books)
    sliding = evaluator(16).slow(model, books, stateful=False)
    assert side_by_side.tokens == sliding.tokens == len(fast) - 1
    # sums of ~10^4 float32 losses of ~7.6 nats, summed in float64 here and there
    assert fast[1:].sum().item() == pytest.approx(side_by_side.loss_sum, rel=1e-5)
    assert slow[1:].sum().item() == pytest.approx(sliding.loss_sum, rel=1e-5)
    # a target at position >= 3/4 seq_len of a side-by-side window sits at the same position of a slow window
    context = (torch.arange(1, len(fast)) - 1) % cfg.seq_len
    full = context >= cfg.seq_len * 3 // 4
    assert torch.allclose(slow[1:][full], fast[1:][full], atol=1e-5)
    assert not torch.allclose(slow[1:][~full], fast[1:][~full], atol=1e-5)  # shorter context: other numbers


def test_the_runs_slow_protocol_is_followed(script, default_corpus_root, tmp_path, single_thread):
    """With the official last_n protocol the first seq_len - last_n targets are not scored, as in the evaluator."""
    torch.manual_seed(0)
    cfg = gpt_configs.get("cpu", d_model=32, n_layers=1, n_heads=2, d_head=16, seq_len=32)
    model = GPT(cfg).eval()
    hand_made_run(tmp_path / "run", "gpt", model, cfg, default_corpus_root / "books_2048", slow_eval="last_n")
    fast, slow = script.main([str(tmp_path / "run"), "--split", "test"])
    books = BooksDataset(default_corpus_root, 2048).books("test")
    sliding = Evaluator(torch.ones(2048), 2048, cfg.seq_len, torch.device("cpu"), 16, max_batches=None,
                        slow_protocol="last_n").slow(model, books, stateful=False)
    scored = ~slow.isnan()
    assert not scored[:cfg.seq_len - cfg.seq_len // 4 + 1].any() and int(scored.sum()) == sliding.tokens
    assert slow[scored].sum().item() == pytest.approx(sliding.loss_sum, rel=1e-5)


def test_a_stateful_model_is_refused(script, default_corpus_root, tmp_path):
    cfg = qlstm_configs.get("cpu", d_model=32, n_layers=1, n_heads=2, d_head=16, seq_len=16)
    hand_made_run(tmp_path / "run", "qlstm", QLSTM(cfg), cfg, default_corpus_root / "books_2048")
    with pytest.raises(SystemExit, match="stateful"):
        script.main([str(tmp_path / "run"), "--max_tokens", "100"])
