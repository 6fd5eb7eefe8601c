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
from twinrun.golden.fingerprint import fingerprint, written_on
from twinrun.golden.traces import trace_path

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
    assert lines == [f"golden: PASS — 14 items equal {committed} (torch {fingerprint()['torch']}, "
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
    assert lines[1].startswith(f"  1 of 14 items moved: {named}")
    assert lines[3].startswith("  written on ") and "; this machine: " in lines[3]
    if doc["written_on"] == written_on():
        assert lines[4].startswith("  if the change is intended") and "golden write" in lines[4]
    else:
        assert "portability bug" in lines[4] and "--overwrite" not in lines[4]


def test_a_file_written_on_another_cpu_names_both_and_never_advises_rewriting_it(
    committed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(committed.read_text())
    doc["written_on"] = {"cpu_model": "Some Other CPU", "native_capability": "AVX2"}
    doc["items"]["evaluate.tokens"] += 1
    (tmp_path / committed.name).write_text(json.dumps(doc))
    rc, lines, _ = golden(capsys, "check", str(tmp_path))
    here = written_on()
    assert rc == 1
    assert lines[3] == (f"  written on Some Other CPU (AVX2); this machine: {here['cpu_model']} "
                        f"({here['native_capability']})")  # fmt: skip
    assert "portability bug" in lines[4] and "golden trace" in lines[4]
    assert not any("--overwrite" in line for line in lines)


def test_the_committed_op_trace_matches_and_a_moved_op_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    committed = trace_path(GOLDEN, fingerprint())
    rc, lines, err = golden(capsys, "trace", str(GOLDEN))
    assert rc == 0, "\n".join(lines) + err
    assert lines[0].startswith("golden trace: PASS — ") and lines[0].endswith(f"equal {committed}")
    doc = json.loads(committed.read_text())
    at = next(i for i, e in enumerate(doc["entries"]) if e[0] == "aten.mm.default" and i > 100)
    op, shapes, _, digest, site = doc["entries"][at]
    doc["entries"][at][3] = "0" * 16
    (tmp_path / committed.name).write_text(json.dumps(doc))
    rc, lines, _ = golden(capsys, "trace", str(tmp_path))
    assert rc == 1
    assert lines[0] == (f"golden trace: FAIL — op {at}: {op} on {shapes} computed other bytes "
                        f"({'0' * 16} vs {digest}), called from {site}")  # fmt: skip
    assert lines[1].startswith("  written on ") and site.endswith(tuple("0123456789"))


def test_a_missing_op_trace_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines, err = golden(capsys, "trace", str(tmp_path))
    assert rc == 2 and not lines and len(err.splitlines()) == 1
    assert err.startswith("twinrun: error: no op trace for this platform (optrace-torch-")


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
    mine, theirs = json.loads(written.read_text()), json.loads(committed.read_text())
    assert mine["written_on"] == written_on()  # the machine that wrote it: this one
    assert {k: v for k, v in mine.items() if k != "written_on"} == {
        k: v for k, v in theirs.items() if k != "written_on"
    }
    shutil.copy(committed, written)
    rc, _, err = golden(capsys, "write", str(tmp_path))
    assert rc == 2 and err.startswith(f"twinrun: error: {written} exists")
