"""scripts/evaluate.py: a checkpoint evaluated into results.json gives the numbers of the run's final evaluation."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from languini.experiment import main as train
from projects.gpt import configs
from projects.gpt.model import Model
from tests.core.test_trainer import TINY

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def evaluate_script():
    spec = importlib.util.spec_from_file_location("evaluate", REPO / "scripts" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained_run(default_corpus_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    train("gpt", configs, Model, TINY + ["--data_root", str(default_corpus_root), "--max_steps", "2",
                                         "--out_dir", str(out), "--run_name", "r"])
    return out / "r"


@pytest.fixture
def run_copy(trained_run, tmp_path):
    shutil.copytree(trained_run, tmp_path / "r")
    return tmp_path / "r"


def test_a_run_without_results_gets_the_numbers_of_the_final_evaluation(evaluate_script, trained_run, run_copy):
    trained = json.loads((trained_run / "results.json").read_text())
    (run_copy / "results.json").unlink()  # as a run stopped before its final evaluation
    results = evaluate_script.main([str(run_copy), "--split", "test", "ood_series"])
    assert results["steps"] == 2 and set(results["eval"]["fast"]) == {"test", "ood_series"}
    for mode in ("fast", "slow"):
        for split in ("test", "ood_series"):
            # exact: the same weights through the same kernels on the same batches as the trainer's evaluation
            assert results["eval"][mode][split] == trained["eval"][mode][split]
    assert json.loads((run_copy / "results.json").read_text()) == results


def test_another_protocol_replaces_only_the_entries_it_evaluates(evaluate_script, trained_run, run_copy):
    trained = json.loads((trained_run / "results.json").read_text())
    results = evaluate_script.main([str(run_copy), "--split", "test", "--mode", "slow", "--slow_eval",
                                    "every_target", "--last_n", "4"])
    slow = results["eval"]["slow"]["test"]
    # The run's 2 windows of 32 (--slow_eval_max_windows 2): the first scores all 32 targets, the next its last 4;
    # in training (last_n, 32 // 4 = 8) each scored its last 8.
    assert (slow["protocol"], slow["window"], slow["last_n"], slow["scored_tokens"]) == ("every_target", 32, 4, 36)
    assert trained["eval"]["slow"]["test"]["scored_tokens"] == 2 * 8
    assert results["eval"]["fast"] == trained["eval"]["fast"]
    assert results["eval"]["slow"]["valid"] == trained["eval"]["slow"]["valid"]
    # the training's entry is kept, and what replaced it says so; the others are still train.py's
    assert results["replaced_eval"] == {"slow": {"test": [trained["eval"]["slow"]["test"]]}}
    assert list(results["eval_by"]) == ["slow"] and list(results["eval_by"]["slow"]) == ["test"]
    assert results["eval_by"]["slow"]["test"].startswith("scripts/evaluate.py, 20")


@pytest.mark.parametrize("args,message", [(["--split", "nonsense"], "Split 'nonsense' not in"),
                                          (["--data_root", "/nonexistent"], "prepare_books.py")])
def test_bad_input_gives_one_clear_error(evaluate_script, run_copy, args, message):
    with pytest.raises(SystemExit, match=message):
        evaluate_script.main([str(run_copy), *args])


def test_a_folder_without_a_run_is_explained(evaluate_script, tmp_path):
    with pytest.raises(SystemExit, match="not a run folder"):
        evaluate_script.main([str(tmp_path)])
