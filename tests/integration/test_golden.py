"""The golden suite: this platform's committed file (tests/golden/) must match what the code
computes now — a change that shifts every run alike fails here, naming the first item that moved.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli
from twinrun.golden.files import golden_path
from twinrun.golden.fingerprint import fingerprint

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.fixture(scope="module")
def committed() -> Path:
    path = golden_path(GOLDEN, fingerprint())
    if not path.is_file():
        have = ", ".join(sorted(p.name for p in GOLDEN.glob("golden-*.json")))
        pytest.skip(f"no golden file for this platform ({path.name}); committed: {have}")
    return path


def golden(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    capsys.readouterr()
    rc = run_cli(["golden", *args])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


def test_the_committed_golden_file_matches(
    committed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, err = golden(capsys, "check", str(GOLDEN))
    assert rc == 0, "\n".join(lines) + err
    assert lines == [f"golden: PASS — 13 items equal {committed} (torch {fingerprint()['torch']}, "
                     f"{fingerprint()['device']}, f32)"]  # fmt: skip
    items = json.loads(committed.read_text())["items"]
    assert len(items["generate.tokens"]) == 24 and len(items["extract.hidden"]) == 512


@pytest.mark.parametrize(
    ("item", "index", "named"),
    [("sft.adapter_sha256", None, "sft.adapter_sha256"),
     ("extract.hidden", 17, "extract.hidden[17]"),
     ("evaluate.loss", None, "evaluate.loss")],
)  # fmt: skip
def test_a_changed_value_fails_naming_the_first_item_that_moved(
    committed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], item: str,
    index: int | None, named: str,
) -> None:  # fmt: skip
    doc = json.loads(committed.read_text())
    if index is not None:
        want = doc["items"][item][index]
        doc["items"][item][index] = want + 1.0
    elif isinstance(doc["items"][item], str):
        want = doc["items"][item]
        doc["items"][item] = ("0" if want[0] != "0" else "1") + want[1:]
    else:
        want = doc["items"][item]
        doc["items"][item] = want * (1 + 2**-40)
    (tmp_path / committed.name).write_text(json.dumps(doc))
    rc, lines, _ = golden(capsys, "check", str(tmp_path))
    assert rc == 1
    assert lines[0].startswith(f"golden: FAIL — first moved item {named}: expected ")
    assert lines[0].endswith(f"got {json.dumps(want)}")
    assert lines[1].startswith(f"  1 of 13 items moved: {named}")
    assert lines[3].startswith("  if the change is intended") and "golden write" in lines[3]


def test_a_platform_without_a_file_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "golden-torch-0.1_cpu-z80_f32.json").write_text("{}")
    rc, lines, err = golden(capsys, "check", str(tmp_path))
    assert rc == 2 and not lines
    assert err.startswith("twinrun: error: no golden file for this platform (golden-torch-")
    assert "it has: golden-torch-0.1_cpu-z80_f32.json" in err and len(err.splitlines()) == 1


def test_write_reproduces_the_committed_file_and_refuses_to_replace_one(
    committed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, _ = golden(capsys, "write", str(tmp_path))
    written = tmp_path / committed.name
    assert rc == 0 and lines == [f"golden: wrote {written}"]
    assert written.read_bytes() == committed.read_bytes()
    shutil.copy(committed, written)
    rc, _, err = golden(capsys, "write", str(tmp_path))
    assert rc == 2 and err.startswith(f"twinrun: error: {written} exists")
