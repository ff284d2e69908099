"""scripts/size_table.py: a project's configs against a baseline's of the same size."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import size_table  # noqa: E402  (a script, not a package)


def test_a_baseline_against_itself_has_ratio_one_and_a_hand_counted_size(capsys):
    size_table.main(["gpt", "--baseline", "gpt", "--configs", "cpu", "--fields", "d_model"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| config | d_model | parameters | gpt |")
    cells = [cell.strip() for cell in lines[2].strip("|").split("|")]
    # gpt cpu: vocab 2048, seq 128, width 128, 2 blocks of 4 heads of 32, MLP 512 (projects/gpt/configs.py)
    v, s, d, L = 2048, 128, 128, 2
    block = 4 * d + (3 * d * d + 3 * d + d * d + d) + (2 * 4 * d * d + 4 * d + d)
    assert cells[:3] == ["cpu", "128", f"{(v * d + s * d + L * block + 2 * d + d * v) / 1e6:.1f}M"]
    assert cells[-1] == "1.0000"


def test_a_config_is_compared_with_the_baselines_of_the_size_its_name_starts_with():
    gpt_configs = size_table.load("gpt")[0]
    assert size_table.baseline_name("small", gpt_configs) == "small"
    assert size_table.baseline_name("small_paper", gpt_configs) == "small"
    with pytest.raises(SystemExit, match="no baseline config"):
        size_table.baseline_name("huge_paper", gpt_configs)
