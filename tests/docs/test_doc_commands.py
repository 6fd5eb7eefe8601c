"""Every command shown in README.md, docs/*.md and examples/README.md runs, so the docs cannot go
stale.

The rule, for a page:
- Commands are the lines of fenced ```bash blocks (`\\` continues a line, `&&` chains commands,
  `#` starts a comment). Shell blocks in any other dialect (`sh`, `shell`, `console`) are an
  error: they would escape the test.
- A marker on the line above a block (blank lines between are allowed) changes how it runs:
  `<!-- doc-test: skip (reason) -->` does not run it (GPU, several nodes, installation, long
  benchmarks, fresh processes a named test already runs — the reason is required);
  `<!-- doc-test: exit N -->` expects every command of the block to exit N (a block without it:
  0); `<!-- doc-test: after twinrun demo -->` runs it on a copy of the `twinrun-demo/` that the
  README's first command wrote in the repository root (CI runs that command before the tests).
- A page's blocks run in order in one temporary directory laid out like the repository root
  (`examples/` and `src/twinrun/examples/` are there; `runs/` is empty, so a page builds its toy
  checkpoint as a reader would, `twinrun toy-model runs/toy --seed 0`), and a block may use what
  an earlier block of the same page wrote.
- SUBSTITUTIONS (below) is applied to each command first: the toy checkpoint stands in for a
  real one (`tests/real/` runs the real SmolLM2 checkpoint itself).
- `twinrun ...` and `python -m twinrun ...` run in-process through `run_cli` (with any leading
  `VAR=value` set in the environment); `cd DIR` changes the directory for the page's later
  commands; any other command runs under bash in the current directory.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli

from .conftest import REPO, lay_out

#: Replaced in every command before it runs: (what the docs say, what the test runs, why).
#: Longer entries first: each is applied in order.
SUBSTITUTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "python -m testkit.smollm2 --dir runs/smollm2",
        "twinrun toy-model runs/toy --seed 0",
        "CI does not build the 520 MiB SmolLM2 checkpoint per test: the toy checkpoint stands in",
    ),
    ("runs/smollm2", "runs/toy", "the toy checkpoint stands in for SmolLM2 (tests/real/ run it)"),
)

MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<body>.*?)\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[\w+-]*)\s*$")
SHELLS = {"sh", "shell", "console", "zsh", "shell-session"}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    info: str
    text: str
    marker: str | None  # the body of a doc-test marker above the block

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"


def pages() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "examples/README.md"]
    return [p for p in found if p.is_file()]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["info"]:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        above = MARKER.match(lines[k].strip()) if k >= 0 else None
        body = "\n".join(lines[i + 1 : j])
        out.append(Block(page, i + 1, m["info"], body, above["body"] if above else None))
        i = j + 1
    return out


def commands(text: str) -> list[str]:
    """The commands of a bash block: continuations joined, comments dropped, `&&` split."""
    joined = re.sub(r"\\\n", " ", text)
    out: list[str] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        part: list[str] = []
        for w in [*words, "&&"]:
            if w == "&&":
                if part:
                    out.append(shlex.join(part))
                part = []
            else:
                part.append(w)
    return out


def substitute(command: str) -> str:
    for said, runs, _why in SUBSTITUTIONS:
        command = command.replace(said, runs)
    return command


def test_substitutions() -> None:
    assert substitute("python -m testkit.smollm2 --dir runs/smollm2") == (
        "twinrun toy-model runs/toy --seed 0"
    )
    assert substitute("twinrun tune sft --model runs/smollm2 --output runs/real/sft") == (
        "twinrun tune sft --model runs/toy --output runs/real/sft"
    )


def installs(command: str) -> bool:
    """A command that installs packages or makes an environment: never run by the test."""
    words = shlex.split(command)
    return ("pip" in words and "install" in words) or ("-m" in words and "venv" in words)


def run_command(command: str, monkeypatch: pytest.MonkeyPatch) -> int:
    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words[:1] == ["cd"] and len(words) == 2 and not env:
        monkeypatch.chdir(words[1])
        return 0
    if words[:1] == ["twinrun"] or words[:3] == ["python", "-m", "twinrun"]:
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            return run_cli(words[1:] if words[0] == "twinrun" else words[3:])
    proc_env = dict(os.environ)
    proc_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    proc = subprocess.run(command, shell=True, executable="/bin/bash", env=proc_env, timeout=300)
    return proc.returncode


def marker_kind(block: Block) -> tuple[str, int]:
    """("run", the exit status every command must have), ("skip", 0), or ("demo", 0) for a block
    that reads what `twinrun demo` wrote; a bad marker fails."""
    if block.marker is None:
        return "run", 0
    demo = re.fullmatch(AFTER_DEMO + r"(?:, exit (?P<code>\d+))?", block.marker)
    if demo:
        return "demo", int(demo["code"] or 0)
    skip = re.fullmatch(r"skip \((?P<reason>.*\S.*)\)", block.marker)
    if skip:
        return "skip", 0
    code = re.fullmatch(r"exit (?P<code>\d+)", block.marker)
    if code:
        return "run", int(code["code"])
    raise AssertionError(f"{block.where}: bad doc-test marker {block.marker!r}")


ALL_PAGES = pages()
AFTER_DEMO = "after twinrun demo"  # the block reads ./twinrun-demo, as the README's reader has it
# (", exit N" after it: every command of the block exits N)
DEMO = REPO / "twinrun-demo"


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_blocks_are_bash_and_markers_are_well_formed(page: Path) -> None:
    problems = []
    for block in blocks(page):
        if block.info in SHELLS:
            problems.append(f"{block.where}: a ```{block.info} block: write ```bash")
        if block.marker is not None:
            if block.info != "bash":
                problems.append(f"{block.where}: a doc-test marker above a ```{block.info} block")
            try:
                marker_kind(block)
            except AssertionError as exc:
                problems.append(str(exc))
    assert not problems, "\n".join(problems)


PAGES_WITH_COMMANDS = [p for p in ALL_PAGES if any(b.info == "bash" for b in blocks(p))]


@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS, ids=lambda p: str(p.relative_to(REPO)))
def test_page_commands_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runnable = [b for b in blocks(page) if b.info == "bash" and marker_kind(b)[0] == "run"]
    if not runnable:
        pytest.skip(f"every bash block of {page.relative_to(REPO)} is marked doc-test: skip")
    root = lay_out(tmp_path / "repo", None)
    monkeypatch.chdir(root)
    for block in runnable:
        expected = marker_kind(block)[1]
        cmds = [substitute(c) for c in commands(block.text)]
        assert cmds, f"{block.where}: an empty bash block"
        for command in cmds:
            assert not installs(command), (
                f"{block.where}: `{command}` installs packages; mark the block "
                "<!-- doc-test: skip (installation) -->"
            )
            code = run_command(command, monkeypatch)
            said = f"{block.where}: `{command}` exited {code}, expected {expected}"
            assert code == expected, said


DEMO_BLOCKS = [
    b for p in ALL_PAGES for b in blocks(p) if b.info == "bash" and marker_kind(b)[0] == "demo"
]


@pytest.mark.parametrize("block", DEMO_BLOCKS, ids=lambda b: b.where)
def test_commands_on_the_demos_output(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block marked `after twinrun demo` (`, exit N`) runs on a copy of the demo's directory
    in the repository root: the README's first command makes it, and CI runs that command before
    the tests (a checkout that never ran the demo skips this test, saying so)."""
    if not (DEMO / "run-a" / "twinrun.json").is_file():
        pytest.skip("no twinrun-demo/ in the repository root: run `twinrun demo` there first")
    root = lay_out(tmp_path / "repo", None)
    shutil.copytree(DEMO, root / "twinrun-demo", symlinks=True)
    monkeypatch.chdir(root)
    expected = marker_kind(block)[1]
    for command in commands(block.text):
        code = run_command(substitute(command), monkeypatch)
        assert code == expected, f"{block.where}: `{command}` exited {code}, expected {expected}"


# The parser itself, on hand-written pages.


def test_commands_join_continuations_split_chains_and_drop_comments() -> None:
    text = "# set up\nA=1 twinrun x \\\n  --y 2  # note\ncd d && twinrun z '--q' \"a b\"\n"
    assert commands(text) == ["A=1 twinrun x --y 2", "cd d", "twinrun z --q 'a b'"]


def test_installation_is_never_run() -> None:
    assert installs("pip install -r requirements.lock")
    assert installs("python3.11 -m venv .venv")
    assert not installs("twinrun tune sft --model runs/toy")


def test_markers_are_read_from_the_line_above(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- doc-test: skip (needs a GPU) -->\n\n```bash\nnvidia-smi\n```\n"
        "<!-- doc-test: exit 1 -->\n```bash\ntwinrun diff a b\n```\n"
        "<!-- doc-test: skip () -->\n```bash\nx\n```\n"
        "```sh\ny\n```\n"
    )
    found = blocks(page)
    assert [b.marker for b in found] == ["skip (needs a GPU)", "exit 1", "skip ()", None]
    assert marker_kind(found[0]) == ("skip", 0)
    assert marker_kind(found[1]) == ("run", 1)
    with pytest.raises(AssertionError, match="bad doc-test marker"):
        marker_kind(found[2])
    assert found[3].info in SHELLS
