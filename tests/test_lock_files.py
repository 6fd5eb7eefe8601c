"""The two lock files: `requirements.lock` pins what running twinrun needs and nothing of the test
tools; `requirements-test.lock` pins the test tools on top of it. (CI installs the first, runs
`twinrun demo`, and only then installs the second: the runtime lock is proven sufficient there.)"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TEST_TOOLS = {"pytest", "pytest-xdist", "execnet", "ruff", "mypy", "hypothesis", "import-linter",
              "gguf", "datasets", "pyarrow"}  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "-r ")):
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not pinned with =="
            out[norm(name)] = version
    return out


def runtime_closure() -> set[str]:
    """twinrun and every distribution its requirements need, without extras (as installed)."""
    seen: set[str] = set()
    todo = ["twinrun"]
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen - {"twinrun"}


def test_the_runtime_lock_pins_what_twinrun_needs_and_no_test_tool() -> None:
    runtime = pins(ROOT / "requirements.lock")
    assert runtime["torch"] == "2.13.0"
    assert not TEST_TOOLS & set(runtime), TEST_TOOLS & set(runtime)
    missing = runtime_closure() - set(runtime) - {"setuptools"}  # (the venv's own, for torch)
    assert not missing, f"needed to run twinrun but not in requirements.lock: {sorted(missing)}"


def test_the_test_lock_adds_the_tools_on_top_of_the_runtime_lock() -> None:
    text = (ROOT / "requirements-test.lock").read_text()
    assert "-r requirements.lock" in text.splitlines()
    runtime, test = pins(ROOT / "requirements.lock"), pins(ROOT / "requirements-test.lock")
    assert not set(runtime) & set(test)  # each package pinned once
    assert TEST_TOOLS <= set(test)
    installed = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    for name, version in {**runtime, **test}.items():
        assert installed.get(name, "").split("+")[0] == version.split("+")[0], name
