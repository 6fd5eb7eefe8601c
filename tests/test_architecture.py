"""The architecture as CI enforces it: the import layers and cycles (import-linter, configured in
pyproject.toml), a clean type check of src/ (mypy), and no unexplained `# type: ignore`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return env


def test_import_contracts_hold() -> None:
    proc = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout


def test_type_check_is_clean() -> None:
    # mypy's own incremental cache in the repository (.mypy_cache/, git-ignored), the one a plain
    # `mypy` and the pre-commit hook use too: only the first run on a checkout pays (about a
    # minute on 2 cores); after it, mypy re-checks only the modules that changed (seconds)
    proc = subprocess.run(
        [str(BIN / "mypy"), "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Success: no issues found"), proc.stdout


def test_every_type_ignore_names_its_code_and_says_why() -> None:
    justified = re.compile(r"# type: ignore\[[a-z-]+(,[a-z-]+)*\]  # \S")
    bare = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "# type: ignore" in line and not justified.search(line)
    ]
    assert bare == []


def test_valid_run_holds_each_required_setting_once_without_none() -> None:
    """The validated run's fields and records hold every required setting (and the replay
    buffer's numbers) exactly once, and any setting at most once, each as its declared type
    without None (a list as a tuple: the records are frozen)."""
    import typing

    from twinrun.config.resolved import COMMON, RECORDS, ReplayPins, ValidRun
    from twinrun.config.run import REPLAY_FIELDS, RunConfig, required_fields
    from twinrun.objectives.registry import NAMES

    declared = typing.get_type_hints(RunConfig)
    held = [(name, typing.get_type_hints(ValidRun)[name]) for name in COMMON]
    for kind in RECORDS:
        held += list(typing.get_type_hints(kind).items())
    required = {n for o in NAMES for n in required_fields(o)} | set(REPLAY_FIELDS)
    names = [n for n, _ in held]
    assert len(names) == len(set(names))
    assert required <= set(names)
    pins = typing.get_type_hints(ReplayPins).items()
    for name, kind in [*held, *pins]:
        given = list[str] if kind == tuple[str, ...] else kind
        assert declared[name] == given | None, name


def test_nothing_points_at_a_document_users_cannot_see() -> None:
    word = "DES" + "IGN"  # spelled apart so this file does not match itself
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("src", "tests", "bench", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".md", ".toml") and path.is_file()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(rf"\b{word}\b", line)
    ]
    assert hits == []
