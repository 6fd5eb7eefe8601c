"""A run directory is data (issue 35 item 2): `twinrun reproduce RUN` never imports or calls the
plugin its twinrun.json names unless the user names the same one with `--env`; a sidecar whose
`train` section is forged (paths, the output, wrong types) is one line, exit 2."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from testkit.toy_runs import SHAPED_MODULE, run_args, write_examples
from twinrun.cli.main import run_cli


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("trust")
    data = write_examples(root / "data")
    run = root / "run"
    assert run_cli(run_args("grpo", toy_model_dir, data["grpo"], run)) == 0
    return run


def forged(run: Path, tmp_path: Path, **train: object) -> Path:
    copy = tmp_path / "forged"
    shutil.copytree(run, copy)
    sidecar = json.loads((copy / "twinrun.json").read_text())
    sidecar["train"].update(train)
    (copy / "twinrun.json").write_text(json.dumps(sidecar))
    return copy


def reproduce(run: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str):
    capsys.readouterr()
    rc = run_cli(["reproduce", str(run), "--output", str(out), *extra])
    captured = capsys.readouterr()
    return rc, (captured.out + captured.err).splitlines()


def marker_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    marker = tmp_path / "ran"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "marker_env_xyz.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef make(**args):\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    return marker


@pytest.mark.parametrize("env", ["numpy:load", "marker_env_xyz:make"])
def test_reproduce_never_imports_the_plugin_a_sidecar_names(
    grpo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], env: str,
) -> None:  # fmt: skip
    marker = marker_plugin(tmp_path, monkeypatch)
    run = forged(grpo_run, tmp_path, env=env, env_args={"file": str(marker)})
    rc, lines = reproduce(run, tmp_path / "again", capsys)
    assert rc == 2 and len(lines) == 1, lines
    assert env in lines[0] and f"--env {env}" in lines[0]
    assert not marker.exists() and "marker_env_xyz" not in sys.modules
    assert not (tmp_path / "again").exists()


def test_reproduce_env_must_be_the_recorded_one(
    grpo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    marker = marker_plugin(tmp_path, monkeypatch)
    run = forged(grpo_run, tmp_path, env="marker_env_xyz:make")
    rc, lines = reproduce(run, tmp_path / "again", capsys, "--env", f"{SHAPED_MODULE}:make")
    assert rc == 2 and len(lines) == 1 and "is not the environment the run recorded" in lines[0]
    assert not marker.exists()


def test_reproduce_with_the_named_plugin_runs(
    grpo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines = reproduce(grpo_run, tmp_path / "again", capsys, "--env", f"{SHAPED_MODULE}:make")
    assert rc == 0, lines


@pytest.mark.parametrize(
    "train",
    [
        {"output": "/tmp/elsewhere"},
        {"model": "/tmp/model"},
        {"quiet": False},
        {"seed": "not a number"},
        {"adam_betas": 5},
        {"lora_targets": 5},
        {"env_args": 5},
        {"inject": 5},
        {"objective": 5},
        {"objective": "nope"},
        {"report_to": {"a": 1}},
        {"threads": 100000},
    ],
)
def test_a_forged_train_section_is_one_line(
    grpo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], train: dict[str, object]
) -> None:
    run = forged(grpo_run, tmp_path, **train)
    rc, lines = reproduce(run, tmp_path / "again", capsys, "--env", f"{SHAPED_MODULE}:make")
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("reproduce: could not run — ")


@pytest.mark.parametrize(
    "argv",
    [
        ["diff", "{run}", "{orig}"],
        ["export", "{run}", "--output", "{out}"],
        ["evidence", "{run}", "{orig}"],
    ],
)
def test_other_readers_never_import_a_sidecar_plugin(
    grpo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], argv: list[str],
) -> None:  # fmt: skip
    marker = marker_plugin(tmp_path, monkeypatch)
    run = forged(grpo_run, tmp_path, env="marker_env_xyz:make")
    where = {"run": str(run), "orig": str(grpo_run), "out": str(tmp_path / "exported")}
    run_cli([a.format(**where) for a in argv])  # whatever it says, it runs no plugin
    capsys.readouterr()
    assert not marker.exists() and "marker_env_xyz" not in sys.modules


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ("twinrun.core.fileio:atomic_write_text", {"path": "{site}/evil.pth", "text": "import os"}),
        ("twinrun.core.fileio:atomic_write_json", {"path": "{site}/evil.pth", "obj": {}}),
        ("twinrun.core.owned:remove", {"entries": ["{site}/victim.txt"]}),
    ],
)
def test_no_file_or_flag_makes_twinrun_write_through_its_own_functions(
    grpo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], env: str,
    args: dict[str, object], toy_model_dir: Path,
) -> None:  # fmt: skip
    """A forged sidecar, the command line and a TOML config naming a twinrun function that
    writes or deletes: one line, exit 2, and the file is neither written nor removed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "victim.txt").write_text("keep me")
    filled = json.loads(json.dumps(args).replace("{site}", str(site)))
    run = forged(grpo_run, tmp_path, env=env, env_args=filled)
    for extra in ((), ("--env", env)):
        rc, lines = reproduce(run, tmp_path / "again", capsys, *extra)
        assert rc == 2 and len(lines) == 1 and env in lines[0], lines
    arith = tmp_path / "arith.jsonl"
    arith.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    argv = run_args("grpo", toy_model_dir, arith, tmp_path / "cli")
    argv[argv.index("--env") + 1] = env
    argv += [f"--env-arg={k}={json.dumps(v)}" for k, v in filled.items()]
    capsys.readouterr()
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "twinrun's own modules are not plugins" in err[0], err
    assert sorted(p.name for p in site.iterdir()) == ["victim.txt"]
    assert (site / "victim.txt").read_text() == "keep me"
    assert not (tmp_path / "again").exists() and not (tmp_path / "cli").exists()
