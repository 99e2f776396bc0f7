"""A sweep writes a scored copy of each log beside its logs, so `inspect view` shows gradebook's
scores with no other command; the logs themselves are never changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_kit import gradebook, shell_env
from flows_kit import TASK_SPEC
from inspect_ai.log import list_eval_logs, read_eval_log

TESTS = Path(__file__).resolve().parent


def test_a_sweep_writes_scored_copies_for_inspect_view(tmp_path: Path, prefect_api: str) -> None:
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "copies"\nlog_dir = "logs"\nwarehouse = "w.duckdb"\n'
        '[[models]]\nname = "m1"\nmodel = "mockllm/model"\nargs_from = "cluster_kit:mock_args"\n'
        f'[[tasks]]\ntask = "{TASK_SPEC}"\nargs = {{ n = 4 }}\nverifiers = ["math"]\n'
    )
    env = shell_env(tmp_path / "ph", api_url=prefect_api, PYTHONPATH=str(TESTS))
    ran = gradebook("sweep", str(cfg), env=env, cwd=tmp_path)
    assert ran.code == 0, ran.stdout + ran.stderr
    scored_dir = tmp_path / "logs-scored"
    assert f"inspect view --log-dir {scored_dir}" in " ".join(ran.stdout.split())
    [original] = [
        Path(i.name.removeprefix("file://")) for i in list_eval_logs(str(tmp_path / "logs"))
    ]
    [copy] = [Path(i.name.removeprefix("file://")) for i in list_eval_logs(str(scored_dir))]
    assert copy.name == original.name
    scored = read_eval_log(str(copy))
    assert scored.results is not None and scored.results.scores[0].name == "math"
    verdicts = {s.id: s.scores["math"].value for s in scored.samples or []}
    assert verdicts == {1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0}  # the model is wrong on operand 2
    # the log the sweep generated is as Inspect wrote it: no scores
    assert not any(s.scores for s in read_eval_log(str(original)).samples or [])


def test_scored_copies_inside_the_log_dir_are_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "inside"\nlog_dir = "logs"\nscored_log_dir = "logs/scored"\n'
        '[[models]]\nmodel = "mockllm/model"\n[[tasks]]\ntask = "math_verified"\n'
    )
    ran = gradebook("generate", str(cfg), env=shell_env(tmp_path / "ph"), cwd=tmp_path)
    assert ran.code == 2
    [line] = ran.stderr_lines
    assert "scored_log_dir" in line and "inside log_dir" in line


@pytest.mark.parametrize(
    ("key", "url", "said"),
    [
        (
            "warehouse",
            "s3://bucket/sweep",
            "'s3://bucket/sweep' is a URL; the warehouse is a DuckDB file",
        ),
        ("log_dir", "gs://bucket/sweep", "gs://bucket/sweep: gradebook reads and writes s3://"),
        ("scored_log_dir", "gs://bucket/x", "gs://bucket/x: gradebook reads and writes s3://"),
    ],
)
def test_a_url_gradebook_cannot_use_is_one_line_and_no_folder_named_after_it(
    tmp_path: Path, key: str, url: str, said: str
) -> None:
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'name = "urls"\n{key} = "{url}"\n'
        '[[models]]\nmodel = "mockllm/model"\n[[tasks]]\ntask = "math_verified"\n'
    )
    ran = gradebook("generate", str(cfg), env=shell_env(tmp_path / "ph"), cwd=tmp_path)
    assert ran.code == 2
    [line] = ran.stderr_lines
    assert key in line and said in line, line
    assert not (tmp_path / url.split("/")[0]).exists()
