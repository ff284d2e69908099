"""Every command reads its flags one way: no abbreviations, values that may start with '-', true/false only for
booleans, the choices of a flag listed and enforced, and help for every model flag of every project."""
import ast
import dataclasses
import importlib
import subprocess
import sys

import pytest

from languini.experiment import REPO_ROOT, build_parser, main
from languini.flags import Parser, parse_bool
from projects.gpt import configs
from projects.gpt.model import Model

# the projects trained by train.py (a project that is not a language model, LANGUAGE_MODEL = False, has none)
PROJECTS = sorted(p.name for p in (REPO_ROOT / "projects").iterdir() if (p / "configs.py").is_file()
                  and getattr(importlib.import_module(f"projects.{p.name}"), "LANGUAGE_MODEL", True) is not False)


def test_flag_prefixes_are_not_taken_for_flags(capsys):
    with pytest.raises(SystemExit):
        main("gpt", configs, Model, ["--compute_clas", "2m"])
    assert "unrecognized arguments: --compute_clas 2m" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main("gpt", configs, Model, ["--max_step", "3"])
    assert "unrecognized arguments: --max_step 3" in capsys.readouterr().err


def test_every_argument_parser_of_the_kitchen_refuses_prefixes():
    """argparse's ArgumentParser takes --compute_clas for --compute_class; languini.flags.Parser does not."""
    offenders = []
    for path in [*REPO_ROOT.glob("languini/*.py"), *REPO_ROOT.glob("scripts/*.py"), *REPO_ROOT.glob("projects/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "ArgumentParser" and path.name != "flags.py"):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == [], f"use languini.flags.Parser instead of argparse.ArgumentParser in {offenders}"


def test_a_value_may_start_with_a_dash(capsys):
    with pytest.raises(SystemExit, match="compute class '-5h' not understood"):
        main("gpt", configs, Model, ["--compute_class", "-5h"])
    parser = Parser()
    parser.add_argument("--offset", type=int)
    parser.add_argument("--dry_run", type=parse_bool, nargs="?", const=True)
    assert vars(parser.parse_args(["--offset", "-3", "--dry_run"])) == {"offset": -3, "dry_run": True}
    with pytest.raises(SystemExit):  # a flag after a flag is still a missing value, not a value
        parser.parse_args(["--offset", "--dry_run"])
    assert "--offset: expected one argument" in capsys.readouterr().err


@pytest.mark.parametrize("text,value", [("true", True), ("False", False), ("TRUE", True)])
def test_booleans_are_true_or_false(text, value):
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["yes", "no", "1", "0", "maybe"])
def test_other_boolean_words_are_refused(text, capsys):
    with pytest.raises(SystemExit):
        main("gpt", configs, Model, ["--max_steps", "1", "--dry_run", text])
    assert f"expected true or false, got '{text}'" in capsys.readouterr().err


@pytest.mark.parametrize("project", PROJECTS)
def test_every_model_flag_has_help_and_a_default(project):
    module = importlib.import_module(f"projects.{project}.configs")
    missing = [f.name for f in dataclasses.fields(module.ModelConfig) if not f.metadata.get("help")]
    assert missing == [], f"{project}'s ModelConfig fields without help (use languini.flags.arg): {missing}"
    text = build_parser(project, module, ["--config", next(iter(module.SIZES))]).format_help()
    assert "(default: " in text.split("model (each overrides")[1]


def test_help_lists_the_choices_and_the_defaults_of_the_config_named():
    text = " ".join(build_parser("gpt", configs, ["--config", "small"]).format_help().split())
    assert "--attention {math,sdpa}" in text and "the defaults shown are config 'small'" in text
    assert "width of the residual stream (default: 768)" in text
    assert "--resume {true,false,auto}" in text
    assert "<project>_<config>_<dataset>-<its fingerprint>_<compute class or N steps>_bs<batch>_seed<seed>" in text


def test_a_command_redirected_to_a_file_prints_lines_without_library_noise(default_corpus_root, tmp_path):
    """No DeepSpeed accelerator warning, no progress-bar carriage returns in a log."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "projects" / "gpt" / "train.py"), "--config", "cpu",
                           "--d_model", "32", "--n_layers", "1", "--n_heads", "2", "--d_head", "16", "--seq_len", "32",
                           "--batch_size", "4", "--eval_batch_size", "4", "--max_steps", "3", "--eval_max_batches", "1",
                           "--slow_eval_max_windows", "1", "--data_root", str(default_corpus_root), "--out_dir",
                           str(tmp_path)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stderr
    assert "Setting accelerator" not in done.stdout + done.stderr
    assert "\r" not in done.stdout + done.stderr
