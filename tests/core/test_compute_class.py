import pytest

from languini import compute_class as cc


@pytest.mark.parametrize(
    "name, seconds",
    [("6h", 21600), ("12h", 43200), ("24h", 86400), ("48h", 172800), ("96h", 345600),
     ("90s", 90), ("15m", 900), ("2h", 7200), ("1.5h", 5400), ("0.1h", 360), (" 6H ", 21600)],
)
def test_durations(name, seconds):
    assert cc.compute_class_seconds(name) == seconds


@pytest.mark.parametrize("name", ["6", "6d", "h", "-6h", "6 h", "1e3s", "6hours", "", "0h", "0.0m", "1.5.h"])
def test_bad_durations_name_the_accepted_forms(name):
    with pytest.raises(ValueError, match=r"90s, 15m, 2h.*6h, 12h, 24h, 48h, 96h"):
        cc.compute_class_seconds(name)


def test_an_upper_case_m_is_refused_not_read_as_minutes():
    with pytest.raises(ValueError, match=r"'2M'.*lower-case m \(2m\).*million"):
        cc.compute_class_seconds("2M")


# Step counts the Languini authors published with their GPT configs (official code, languini/projects/gpt/
# README.md; RTX 3090 throughputs of Table 5, seq_len 512): all are round(3600 h v / (batch * 512)).
@pytest.mark.parametrize(
    "hours, tokens_per_second, batch, steps",
    [(6, 55416, 128, 18265), (12, 55416, 128, 36529), (24, 55416, 256, 36529),
     (48, 16618, 256, 21908), (96, 16618, 256, 43817)],
)
def test_steps_match_published_gpt_runs(hours, tokens_per_second, batch, steps):
    assert cc.training_steps(3600 * hours, tokens_per_second, batch, 512) == steps


def test_steps_round_to_nearest_and_half_up():
    assert cc.training_steps(10, 10, 4, 10) == 3  # 2.5 batches
    assert cc.training_steps(10, 9.9, 4, 10) == 2  # 2.475
    assert cc.training_steps(10, 10.1, 4, 10) == 3  # 2.525
    assert cc.training_steps(0.1 * 3600, 1, 1, 360) == 1  # exact decimal durations


def test_budget_below_half_a_batch_is_an_error():
    with pytest.raises(ValueError, match="longer compute class or a smaller batch"):
        cc.training_steps(90, 100, 64, 512)
