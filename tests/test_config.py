"""The sweep config: what loads, and what a user sees when it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from scorers.grade import Grade, SampleView, scored
from scorers.registry import Verifier, register
from sweeps.config import ConfigError, load_config, parse_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


GOOD = """
name = "nightly"
schedule = "0 3 * * *"
log_dir = "logs"
warehouse = "wh.duckdb"

[[models]]
name = "ckpt-1"
model = "openai-api/local/ckpt-1"
base_url = "http://127.0.0.1:8000/v1"
config = { temperature = 0.0, max_retries = 2 }

[[models]]
model = "mockllm/model"

[[tasks]]
task = "math_verified"
limit = 5
epochs = 2
verifiers = ["{verifier}"]

[gates]
min_accuracy = 0.5
max_unscored_rate = 0.1
"""


def _always_right(view: SampleView) -> Grade:
    return scored(1.0, answer=view.completion, explanation="test verifier", reason="test")


@pytest.fixture
def verifier_name() -> str:
    register(Verifier("config_test", _always_right, module=__name__, label="test"))
    return "config_test"


def test_good_config_loads_and_resolves_paths_next_to_the_file(tmp_path, verifier_name):
    cfg = load_config(_write(tmp_path, GOOD.replace("{verifier}", verifier_name)))
    assert cfg.name == "nightly"
    assert cfg.warehouse == tmp_path / "wh.duckdb"
    assert cfg.log_dir == tmp_path / "logs"
    assert [m.label for m in cfg.models] == ["ckpt-1", "mockllm/model"]
    assert cfg.tasks[0].epochs == 2
    assert cfg.gates.min_accuracy == 0.5
    # grouped by model: both tasks of model 1 before any of model 2
    assert [m.label for m, _ in cfg.pairs()] == ["ckpt-1", "mockllm/model"]


ROOT = EXAMPLES.parent


@pytest.mark.parametrize("spec", ["gsm8k_verified", f"{ROOT / 'tasks' / 'math.py'}@gsm8k_verified"])
def test_relative_paths_in_task_args_resolve_like_task_files(tmp_path, monkeypatch, spec):
    config_dir, run_dir = tmp_path / "sweeps", tmp_path / "elsewhere"
    for root in (config_dir, run_dir):
        (root / "data").mkdir(parents=True)
        (root / "data" / "gsm.jsonl").write_text("{}\n")
        (root / "train").mkdir()
    (run_dir / "only_here.jsonl").write_text("{}\n")
    monkeypatch.chdir(run_dir)
    args = {
        "path": "data/gsm.jsonl",  # next to the config and in the cwd: the config's wins
        "cwd_file": "only_here.jsonl",  # only in the current directory
        "missing": "data/absent.jsonl",
        "word": "train",  # a directory of that name exists, but a word is not a path
        "dot_dir": "./train",
        "dataset_id": "openai/gsm8k",
        "absolute": "/no/such/file.jsonl",
        "url": "https://example.org/data/gsm.jsonl",
        "number": 3,
        "files": ["data/gsm.jsonl", "data/absent.jsonl"],
        "nested": {"path": "data/gsm.jsonl"},
    }
    cfg = parse_config(
        {
            "name": "args",
            "models": [{"model": "mockllm/model"}],
            "tasks": [{"task": spec, "args": args, "verifiers": ["math"]}],
        },
        source=config_dir / "sweep.toml",
    )
    mine = str(config_dir / "data" / "gsm.jsonl")
    assert cfg.tasks[0].args == {
        **args,
        "path": mine,
        "cwd_file": str(run_dir / "only_here.jsonl"),
        "dot_dir": str(config_dir / "train"),
        "files": [mine, "data/absent.jsonl"],
        "nested": {"path": mine},
    }


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("limit = 5", "limit = 0"), "tasks[0] (math_verified).limit: Input should be greater"),
        (("epochs = 2", "epoch = 2"), "tasks[0] (math_verified).epoch: unknown key"),
        (('model = "mockllm/model"', 'model = "gpt4"'), "models[1] (gpt4).model: must be an"),
        (("temperature = 0.0", "temprature = 0.0"), "unknown generation setting(s) ['temprature']"),
        (('"0 3 * * *"', '"every night"'), "schedule: 'every night' is not a cron string"),
        (("min_accuracy = 0.5", "min_accuracy = 1.5"), "gates.min_accuracy"),
        (('name = "nightly"', 'name = "my sweep!"'), "name: must be letters, digits"),
        (('name = "nightly"', ""), "name: required key is missing"),
    ],
)
def test_each_bad_key_is_named_with_the_file_and_what_is_allowed(
    tmp_path, verifier_name, edit, expected
):
    text = GOOD.replace("{verifier}", verifier_name).replace(*edit)
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg
    assert expected in msg


def test_unknown_verifier_lists_the_registered_ones(tmp_path, verifier_name):
    path = _write(tmp_path, GOOD.replace("{verifier}", "mathh"))
    with pytest.raises(
        ConfigError,
        match=r"unknown verifier\(s\) \['mathh'\] \(did you mean 'math'.*\); registered: ",
    ) as e:
        load_config(path)
    assert verifier_name in str(e.value)


def test_missing_task_file_and_bad_toml_are_one_line_errors(tmp_path, verifier_name):
    text = GOOD.replace("{verifier}", verifier_name).replace("math_verified", "nope/x.py@t")
    with pytest.raises(ConfigError, match=r"tasks\[0\].task: file 'nope/x.py' not found"):
        load_config(_write(tmp_path, text))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "name = "))
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.toml")


def test_empty_lists_are_rejected():
    with pytest.raises(ConfigError, match="models: List should have at least 1 item"):
        parse_config({"name": "x", "models": [], "tasks": []}, source="x.toml")


def test_every_example_config_loads():
    examples = sorted(EXAMPLES.glob("*.toml"))
    assert examples, "examples/*.toml missing"
    for path in examples:
        cfg = load_config(path)
        assert cfg.tasks and cfg.models
