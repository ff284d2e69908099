"""The memory layers' statistics and vocabulary, against hand computations."""
import dataclasses
import math

import pytest
import torch

from languini.memory_layers import check_renamed, check_value_grad, query_norm_layer
from languini.memory_stats import MemoryStats
from projects.feedback import configs as feedback_configs
from projects.lram_gpt import configs as lram_configs
from projects.pkm_gpt import configs as pkm_configs


def test_usage_and_kl_by_hand():
    stats = MemoryStats(4)
    stats.update(torch.tensor([[0, 1], [1, 1]]), torch.tensor([[0.5, 0.5], [0.25, 0.75]]))
    result = stats.result()
    # weight per row (0.5, 1.5, 0, 0): half the rows used, p = (1/4, 3/4, 0, 0)
    assert result["memory_usage"] == 0.5
    assert result["kl_from_uniform"] == pytest.approx(0.25 * math.log(1.0) + 0.75 * math.log(3.0))
    # Gini of (0, 0, 1/4, 3/4) rising: sum (2i - 5) p_i / 4 = (1 * 1/4 + 3 * 3/4) / 4 = 0.625
    assert result["gini"] == pytest.approx(0.625)
    # the heaviest row holds 75%: one row of four reaches 50% and two reach 90% and 99%
    assert (result["rows_for_50"], result["rows_for_90"], result["rows_for_99"]) == (0.25, 0.5, 0.5)


def test_uniform_reads_are_even():
    uniform = MemoryStats(4)
    uniform.update(torch.tensor([0, 1, 2, 3]), torch.ones(4))
    result = uniform.result()
    assert result["memory_usage"] == 1.0 and result["kl_from_uniform"] == pytest.approx(0.0)
    assert result["gini"] == pytest.approx(0.0)
    # 2 of 4 rows hold 50% exactly; 90% and 99% need all four
    assert (result["rows_for_50"], result["rows_for_90"], result["rows_for_99"]) == (0.5, 1.0, 1.0)


def test_one_row_holds_everything():
    stats = MemoryStats(5)
    stats.update(torch.tensor([3, 3]), torch.tensor([0.5, 2.0]))
    result = stats.result()
    assert result["memory_usage"] == 0.2 and result["kl_from_uniform"] == pytest.approx(math.log(5))
    assert result["gini"] == pytest.approx(0.8)  # (n - 1) / n for a single row
    assert result["rows_for_99"] == 0.2


def test_no_reads_and_mismatched_shapes_raise():
    with pytest.raises(ValueError, match="no memory reads"):
        MemoryStats(3).result()
    with pytest.raises(ValueError, match="must match"):
        MemoryStats(3).update(torch.tensor([0, 1]), torch.ones(3))


@pytest.mark.parametrize("fields, message", [
    pytest.param({"pkm_value_grad": "atomic"}, "pkm_value_grad -> memory_value_grad", id="old-field"),
    pytest.param({"memory_value_grad": "sorted"}, "'sorted' -> 'segment'", id="sorted"),
    pytest.param({"pkm_query_norm": "layernorm"}, "'layernorm' -> 'layer'", id="layernorm"),
])
def test_old_names_in_saved_configs_name_the_new_ones(fields, message):
    with pytest.raises(ValueError, match=message):
        check_renamed(fields, pkm_configs.ModelConfig)


def test_a_field_the_config_still_has_is_no_old_name():
    # feedback's memory_layer (which layer feeds the memory) is its own field, not lram_gpt's old memory_layer
    check_renamed(dataclasses.asdict(feedback_configs.get("cpu")), feedback_configs.ModelConfig)
    with pytest.raises(ValueError, match="memory_layer -> memory_layers"):
        check_renamed({"memory_layer": 3}, lram_configs.ModelConfig)


def test_current_names_pass_and_old_values_are_refused_with_a_hint():
    check_renamed({"memory_value_grad": "segment", "memory_query_norm": "layer", "d_model": 64},
                  pkm_configs.ModelConfig)
    with pytest.raises(ValueError, match="renamed to 'segment'"):
        check_value_grad("sorted")
    with pytest.raises(ValueError, match="renamed to 'batch'"):
        query_norm_layer("batchnorm", 8)
    assert isinstance(query_norm_layer("batch", 8), torch.nn.BatchNorm1d)
    assert isinstance(query_norm_layer("layer", 8), torch.nn.LayerNorm)
    assert isinstance(query_norm_layer("none", 8), torch.nn.Identity)


def test_evaluating_a_checkpoint_with_old_names_fails_naming_the_new_ones(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    from languini import checkpoint

    script = Path(__file__).resolve().parents[2] / "scripts" / "evaluate.py"
    spec = importlib.util.spec_from_file_location("evaluate", script)
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    (tmp_path / "config.json").write_text(json.dumps({"project": "pkm_gpt", "config": "cpu", "train": {}}))
    torch.save({"step": 3, "model_config": {"d_model": 64, "pkm_value_grad": "sorted"}}, tmp_path / checkpoint.CHECKPOINT)
    with pytest.raises(SystemExit, match="pkm_value_grad -> memory_value_grad.*'sorted' -> 'segment'"):
        evaluate.main([str(tmp_path)])
