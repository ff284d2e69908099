"""The project's scripts: the GPT of gpt_baseline.py against projects/gpt/model.py and its cached generation
against its forward; bench_speed.py's and bench_generation.py's tables; the random walks of tasks.py against a
hand-worked walk, and the task's script end to end on a tiny budget; the toy tasks' data against hand checks and an
interpreter."""
import pytest
import torch

from projects.feedback import bench_generation, bench_speed, configs, tasks, toy_tasks
from projects.feedback.gpt_baseline import GPT, CachedDecoder, GPTConfig


def test_gpt_baseline_equals_the_gpt_project():
    from projects.gpt import configs as gpt_configs
    from projects.gpt.model import Model as OriginalGPT

    for attention in ("math", "sdpa"):
        cfg = bench_speed.gpt_config(configs.get("cpu", n_layers=1, seq_len=16), attention)
        torch.manual_seed(0)
        # the baseline's one addition, the attention window, off (None) as the GPT project has none
        original = OriginalGPT(gpt_configs.ModelConfig(**{k: v for k, v in vars(cfg).items() if k != "window"}))
        torch.manual_seed(0)
        copy = GPT(cfg)
        assert copy.state_dict().keys() == original.state_dict().keys()
        copy.load_state_dict(original.state_dict())
        tokens = torch.randint(cfg.vocab_size, (2, 16))
        with torch.no_grad():
            # the same weights through two models: fp32 tolerance (a kernel may differ by machine)
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


def test_generation_bench_prints_both_models_at_each_context(capsys, single_thread, tmp_path):
    rows = bench_generation.main(["--config", "cpu", "--contexts", "6", "9", "--streams", "1", "2", "--tokens", "3",
                                  "--repeats", "1", "--csv", str(tmp_path / "g.csv")])
    assert [(r["context"], r["streams"]) for r in rows] == [(6, 1), (6, 2), (9, 1), (9, 2)]
    for row in rows:
        assert all(row[k] > 0 for k in bench_generation.COLUMNS)
        assert row["ratio_at_context"] == row["feedback_at_context"] / row["gpt_at_context"]
    assert "from empty: gpt" in capsys.readouterr().out
    assert (tmp_path / "g.csv").read_text().count("\n") == 5


def test_generation_bench_with_the_decoders_cuda_graph(single_thread):
    """--cuda_graph: refused without a GPU; on one, the full ring's steps replayed from the graph."""
    argv = ["--config", "cpu", "--contexts", "6", "--streams", "2", "--tokens", "3", "--repeats", "1", "--cuda_graph",
            "true"]
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--cuda_graph needs a CUDA device"):
            bench_generation.main(argv)
        return
    (row,) = bench_generation.main(argv)
    assert all(row[k] > 0 for k in bench_generation.COLUMNS)


def test_walks_against_a_hand_worked_walk():
    tokens, cells, mask, vocab = tasks.random_walk(1, 6, 3, torch.Generator().manual_seed(0))
    # 3 x 3 grid: start cell 8 = (2, 2); west to (2, 1) = 7; south into the wall, still 7; north to (1, 1) = 4; west
    # to (1, 0) = 3; west into the wall, still 3
    assert [vocab.words[t] for t in tokens[0]] == ["c8", "W", "S", "N", "W", "W"]
    assert [vocab.words[c] for c in cells[0]] == ["c8", "c7", "c7", "c4", "c3", "c3"] and bool(mask.all())


def words(vocab, row):
    return [vocab.words[i] for i in row.tolist()]


def test_copy_reverse_and_counting_ask_what_their_inputs_say():
    g = torch.Generator().manual_seed(1)
    for task, order in ((tasks.copy, 1), (tasks.reverse, -1)):
        tokens, targets, mask, vocab = task(3, 5, 4, g)
        for b in range(3):
            assert words(vocab, tokens[b])[5:] == ["SEP"] + ["?"] * 5
            assert words(vocab, targets[b][mask[b]]) == words(vocab, tokens[b, :5])[::order]
    tokens, targets, mask, vocab = tasks.counting(50, 7, g)
    for b in range(50):
        k = words(vocab, tokens[b]).count("A")
        assert words(vocab, targets[b][mask[b]]) == ["B"] * k + ["END"]


def run_program(words_):
    """An interpreter of the algorithmic task's statements, written apart from the generator: the printed values."""
    values, printed, statement = {}, [], []
    for word in words_:
        statement.append(word)
        if word != ";":
            continue
        if statement[0] == "if":
            var, op, bound = statement[1], statement[2], statement[3]
            bound = values[bound] if bound in values else int(bound)
            holds = values[var] < bound if op == "<" else values[var] > bound
            statement = statement[5:] if holds else [";"]
        if statement[0] == "print":
            printed.append(values[statement[1]])
        elif len(statement) == 4 and statement[1] == "=":
            values[statement[0]] = int(statement[2])
        elif len(statement) == 3:
            values[statement[0]] += 1 if statement[1] == "++" else -1
        statement = []
    return printed


@pytest.mark.parametrize("variables", [3, 5])
def test_algorithmic_labels_are_what_the_program_prints(variables):
    tokens, targets, mask, vocab = tasks.algorithmic(20, 40, variables, torch.Generator().manual_seed(variables))
    prints = 0
    for b in range(20):
        program = [w for w in words(vocab, tokens[b]) if w != "<pad>"]
        printed = run_program(program)
        assert [int(w) for w in words(vocab, targets[b][mask[b]])] == printed
        assert all(1 <= v <= 10 for v in printed) and set(program) <= set(vocab.words)
        prints += len(printed)
    assert prints > 20  # a print is one statement in five


def test_toy_tasks_run_both_models_on_every_task(single_thread, tmp_path):
    for task in toy_tasks.DEFAULT_N:
        results = toy_tasks.main(["--task", task, "--n", "6", "--seconds", "0.3", "--d_model", "16", "--n_heads",
                                  "2", "--eval_sequences", "60", "--batch_size", "4", "--window", "4", "--seeds",
                                  "0", "1", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "p.png")])
        assert set(results) == {"feedback", "gpt"} and (tmp_path / "p.png").stat().st_size > 0
        for runs in results.values():
            assert [r["seed"] for r in runs] == [0, 1]
            for r in runs:
                assert r["steps"] >= 1 and 0 <= r["sequence_accuracy"] <= r["accuracy"] <= 1


def test_the_gpt_window_hides_what_lies_that_far_back():
    cfg = GPTConfig(vocab_size=11, seq_len=8, d_model=16, n_layers=1, n_heads=2, d_head=8, window=3)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    x = torch.randint(11, (1, 8))
    changed = x.clone()
    changed[0, 0] = (x[0, 0] + 1) % 11
    with torch.no_grad():
        a, b = model(x)[0], model(changed)[0]
    # one layer of a 3-position window: position 3 and later never see position 0
    assert (a[0, :3] - b[0, :3]).abs().max() > 1e-3
    torch.testing.assert_close(a[0, 3:], b[0, 3:], rtol=1e-6, atol=1e-6)
    decoder = CachedDecoder(model, batch=1)
    with torch.no_grad():
        stepped = torch.stack([decoder.step(x[:, t]) for t in range(8)], dim=1)
    torch.testing.assert_close(stepped, a, rtol=1e-5, atol=1e-5)
