"""The architecture as CI enforces it: the import layers and cycles (import-linter, configured in
pyproject.toml), a clean type check of src/ (mypy), no unexplained `# type: ignore`, and every
process twinrun starts started with the user's environment."""

from __future__ import annotations

import ast
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
        for folder in ("src", "tests", "testkit", "bench", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".md", ".toml") and path.is_file()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(rf"\b{word}\b", line)
    ]
    assert hits == []


SPAWNS = {"run", "Popen", "call", "check_call", "check_output", "execv", "execve", "execvp",
          "execvpe", "spawnv", "spawnve", "system", "popen", "fork", "forkpty"}  # fmt: skip


def test_every_process_twinrun_starts_gets_the_user_s_environment() -> None:
    """A child run takes the portable pin this process set for the user's own setting unless it
    is started with `env=user_environment()` (twinrun.core.portable); no other way to start
    one (`os.system`, `exec*`, `fork`, multiprocessing) is used."""
    spawns, wrong = [], []
    for path in sorted((SRC / "twinrun").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.startswith("multiprocessing") for n in names), path
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id in ("subprocess", "os")):
                continue
            if node.func.attr not in SPAWNS:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            spawns.append(where)
            env = [k.value for k in node.keywords if k.arg == "env"]
            if not (env and ast.unparse(env[0]) == "user_environment()"):
                wrong.append(where)
    assert len(spawns) >= 2  # check's runs and evidence's replays
    assert wrong == []
