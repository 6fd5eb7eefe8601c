"""Every refusal of a replay, in docs/capture.md's order, with its message and nothing written;
and the v1 source capture failing closed. `explain` must name the same failing check, with every
check before it passing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from testkit.captures import (
    Capture,
    arith,
    grpo_source,
    init_adapter,
    metrics,
    plugin,
    run_config,
    write_toml,
)
from twinrun.cli.main import run_cli

GC = "backend.options.gradient_checkpointing"


@pytest.fixture(scope="module")
def cap(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Capture:
    root = tmp_path_factory.mktemp("checks")
    init = init_adapter(root / "init", toy_model_dir)
    doc = grpo_source(toy_model_dir, arith(root), plugin(root), init, root / "source")
    assert run_config(root / "source.toml", doc) == 0
    return Capture(doc, root / "source", 0)


def copied(cap: Capture, tmp_path: Path) -> Capture:
    out = tmp_path / "src"
    shutil.copytree(cap.out, out)
    return Capture(cap.source, out, 0)


def refused(
    tmp_path: Path, doc: dict[str, Any], capsys: pytest.CaptureFixture[str], check: str, match: str
) -> None:
    cfg = str(write_toml(tmp_path / "replay.toml", doc))
    out = Path(doc["logging"]["dir"])
    before = sorted(out.rglob("*")) if out.exists() else None
    capsys.readouterr()
    assert run_cli(["explain", cfg, "--json"]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    names = [c["name"] for c in checks]
    i = names.index(check)
    assert [c["status"] for c in checks[:i]] == ["pass"] * i, checks
    assert checks[i]["status"] == "fail" and match in checks[i]["detail"], checks[i]
    assert run_cli(["run", cfg]) == 2
    err = capsys.readouterr().err
    assert match in err, err
    after = sorted(out.rglob("*")) if out.exists() else None
    assert after == before  # nothing written


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_existing_output(cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "keep.txt").write_text("mine")
    refused(tmp_path, cap.replay_config(tmp_path / "r"), capsys, "fresh output paths",
            "exists and is not empty")  # fmt: skip
    assert (tmp_path / "r" / "keep.txt").read_text() == "mine"


def test_manifest_pin(cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cap.replay_config(tmp_path / "r")
    doc["optimizer_batch"]["expected_manifest_sha256"] = "0" * 64
    refused(tmp_path, doc, capsys, "manifest pin",
            f"Expected sha256 {'0' * 64}  Got {sha(cap.manifest)}")  # fmt: skip


def test_manifest_not_parsed_before_its_pin(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = copied(cap, tmp_path)
    c.manifest.write_bytes(b"not json at all")
    doc = cap.replay_config(tmp_path / "r")
    doc["optimizer_batch"]["replay_path"] = str(c.manifest)
    refused(tmp_path, doc, capsys, "manifest pin", "Expected sha256")  # the pin fails first
    doc["optimizer_batch"]["expected_manifest_sha256"] = sha(c.manifest)
    refused(tmp_path, doc, capsys, "manifest pin", "manifest: not valid JSON")


def test_payload_byte_flip(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = copied(cap, tmp_path)
    payload = c.out / "optimizer_batch_step_000000.safetensors"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x01
    payload.write_bytes(bytes(data))
    doc = c.replay_config(tmp_path / "r")
    refused(
        tmp_path, doc, capsys, "payload sha256", f"Expected sha256 {sha(cap.out / payload.name)}"
    )


def test_payload_name_escaping_its_folder(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = copied(cap, tmp_path)
    name = "optimizer_batch_step_000000.safetensors"
    shutil.copy(c.out / name, tmp_path / name)  # a real payload, but outside the folder
    manifest = json.loads(c.manifest.read_text())
    manifest["payload"]["file"] = f"../{name}"
    c.manifest.write_text(json.dumps(manifest))
    doc = c.replay_config(tmp_path / "r")  # pins this manifest
    refused(tmp_path, doc, capsys, "payload sha256", "escapes the capture folder")


def test_logical_pin(cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cap.replay_config(tmp_path / "r")
    doc["optimizer_batch"]["expected_logical_sha256"] = "1" * 64
    got = cap.row["optimizer/logical_batch_sha256"]
    refused(tmp_path, doc, capsys, "logical digest", f"Expected sha256 {'1' * 64}  Got {got}")


def test_adapter_changed(
    cap: Capture, tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = init_adapter(tmp_path / "other", toy_model_dir, seed=8)
    doc = cap.replay_config(tmp_path / "r", resume={"from": str(other)})
    refused(tmp_path, doc, capsys, "initial adapter sha256",
            f"Expected sha256 {cap.row['optimizer_batch/initial_adapter_sha256']}")  # fmt: skip


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"backend.options": {"gradient_checkpointing": True}},
         f"undeclared difference {GC}: source false, replay true"),
        ({"optimizer_batch": {"allow_config_differences": [GC]}},
         f"declared difference {GC} is not present"),
        ({"training": {"learning_rate": 0.1},
          "optimizer_batch": {"allow_config_differences": ["training.learning_rate"]}},
         "training.learning_rate may not differ in v1"),
        ({"grpo": {"token_cap": 2}}, "undeclared difference grpo.token_cap: source 3, replay 2"),
    ],
)  # fmt: skip
def test_contract_refusals(
    cap: Capture,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sections: dict[str, Any],
    match: str,
) -> None:
    refused(tmp_path, cap.replay_config(tmp_path / "r", **sections), capsys,
            "optimizer contract", match)  # fmt: skip


@pytest.mark.parametrize(
    ("section", "key", "match"),
    [
        ("optimizer_batch", "expected_logical_sha256", "missing optimizer_batch.expected_logical"),
        ("optimizer_batch", "expected_manifest_sha256", "missing optimizer_batch.expected_manif"),
        ("training", "seed", "missing training.seed"),
    ],
)
def test_missing_pins_and_seed(
    cap: Capture,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    section: str,
    key: str,
    match: str,
) -> None:
    doc = cap.replay_config(tmp_path / "r")
    del doc[section][key]
    cfg = str(write_toml(tmp_path / "replay.toml", doc))
    capsys.readouterr()
    for command in ("run", "explain"):
        assert run_cli([command, cfg]) == 2
        assert match in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_first_failure_in_order_wins(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte flip, a wrong logical pin and an undeclared difference: the payload is reported."""
    c = copied(cap, tmp_path)
    payload = c.out / "optimizer_batch_step_000000.safetensors"
    data = payload.read_bytes()
    payload.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    doc = c.replay_config(tmp_path / "r", **{"backend.options": {"gradient_checkpointing": True}})
    doc["optimizer_batch"]["expected_logical_sha256"] = "1" * 64
    refused(tmp_path, doc, capsys, "payload sha256", "Expected sha256")
    capsys.readouterr()
    run_cli(["explain", str(tmp_path / "replay.toml"), "--json"])
    status = {c["name"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert status["decode and validate"] == status["logical digest"] == "skip"
    assert status["initial adapter sha256"] == "pass" and status["optimizer contract"] == "fail"


def test_capture_never_overwrites(
    cap: Capture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A capture file that appears before the capture is written is left alone: the run fails
    and neither payload nor manifest replaces it."""
    from twinrun.train.hooks import capture as hook

    capture = hook.CaptureHook.capture

    def stray_first(self: hook.CaptureHook, step: int, outcome: Any) -> None:
        (self.s.out / "optimizer_batch_step_000000.manifest.json").write_text("someone else's")
        capture(self, step, outcome)

    monkeypatch.setattr(hook.CaptureHook, "capture", stray_first)
    doc = json.loads(json.dumps(cap.source))
    doc["logging"]["dir"] = str(tmp_path / "again")
    capsys.readouterr()
    assert run_config(tmp_path / "again.toml", doc) == 2
    assert "already exists; a capture is never overwritten" in capsys.readouterr().err
    out = tmp_path / "again"
    assert (out / "optimizer_batch_step_000000.manifest.json").read_text() == "someone else's"
    assert not (out / "optimizer_batch_step_000000.safetensors").exists()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("state0", "is a completed checkpoint (step 0)"),
        ("steps2", "a v1 capture runs exactly one step"),
        ("save", "set training.save_every = 0"),
        ("noinit", "a v1 capture starts from [resume] from"),
        ("twodev", "backend.devices must name exactly one device"),
    ],
)
def test_v1_capture_fails_closed(
    cap: Capture,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: str,
    match: str,
) -> None:
    doc = json.loads(json.dumps(cap.source))
    doc["logging"]["dir"] = str(tmp_path / "src")
    if change == "state0":
        state = tmp_path / "state"
        shutil.copytree(doc["resume"]["from"], state)
        (state / "trainer_state.json").write_text(json.dumps({"step": 0}))
        doc["resume"]["from"] = str(state)
    elif change == "steps2":
        doc["training"]["max_steps"] = 2
    elif change == "save":
        del doc["training"]["save_every"]
    elif change == "noinit":
        del doc["resume"]
    else:
        doc["backend"]["devices"] = "cpu,cuda:0"
    capsys.readouterr()
    assert run_config(tmp_path / "src.toml", doc) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "src").exists()
    assert run_cli(["explain", str(tmp_path / "src.toml")]) in (1, 2)
    assert match in "".join(capsys.readouterr())


def test_explain_source_config(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(json.dumps(cap.source))
    doc["logging"]["dir"] = str(tmp_path / "new")
    write_toml(tmp_path / "s.toml", doc)
    capsys.readouterr()
    assert run_cli(["explain", str(tmp_path / "s.toml")]) == 0
    out = capsys.readouterr().out
    assert "pass  v1 capture preconditions" in out and "all checks pass" in out
    assert metrics(cap.out)[0]["step"] == 0


@pytest.mark.parametrize(
    ("member", "check"),
    [
        ("manifest", "manifest pin"),
        ("optimizer_batch_step_000000.safetensors", "payload sha256"),
        ("init/adapter_model.safetensors", "initial adapter sha256"),
        ("init/adapter_config.json", "initial adapter sha256"),
        ("init/trainer_state.json", "initial adapter sha256"),
    ],
)
def test_byte_flip_of_every_file_a_replay_reads(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str], member: str, check: str
) -> None:
    """adapter_config.json (use_rslora, rank, alpha) and trainer_state.json are read by the replay
    and so are pinned like the adapter weights: a flipped byte is refused by explain and run."""
    c = copied(cap, tmp_path)
    init = tmp_path / "init"
    shutil.copytree(Path(cap.source["resume"]["from"]), init)
    doc = c.replay_config(tmp_path / "r")
    doc["resume"]["from"] = str(init)
    target = c.manifest if member == "manifest" else (
        tmp_path / member if member.startswith("init/") else c.out / member
    )  # fmt: skip
    data = bytearray(target.read_bytes())
    i = data.index(b"8") if target.suffix == ".json" else len(data) // 2  # alpha 8 / step -1
    data[i] ^= 0x01
    target.write_bytes(bytes(data))
    refused(tmp_path, doc, capsys, check, "Expected sha256")


def test_manifest_pins_every_initial_state_file(cap: Capture) -> None:
    initial = json.loads(cap.manifest.read_text())["initial_state"]
    init = Path(cap.source["resume"]["from"])
    for key, name in (("adapter", "adapter_model.safetensors"),
                      ("adapter_config", "adapter_config.json"),
                      ("trainer_state", "trainer_state.json")):  # fmt: skip
        assert initial[key] == {"file": name, "sha256": sha(init / name)}


@pytest.mark.parametrize("problem", ["max_steps", "missing_examples", "bad_row"])
def test_explain_refuses_source_configs_that_run_refuses(
    cap: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str], problem: str
) -> None:
    doc = json.loads(json.dumps(cap.source))
    doc["logging"]["dir"] = str(tmp_path / "new")
    if problem == "max_steps":
        doc["training"]["max_steps"] = 3
    elif problem == "missing_examples":
        doc["data"]["examples"] = str(tmp_path / "gone.jsonl")
    else:
        ex = tmp_path / "bad.jsonl"
        ex.write_text('{"prompt": "1+1=", "answer": "two"}\n')
        doc["data"]["examples"] = str(ex)
        doc["environment"] = {"name": "arithmetic"}
    write_toml(tmp_path / "s.toml", doc)
    capsys.readouterr()
    assert run_cli(["explain", str(tmp_path / "s.toml")]) != 0
    assert "fail" in capsys.readouterr().out
    assert run_cli(["run", str(tmp_path / "s.toml")]) == 2
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("size", [0, 1, 20, 21, 100])
def test_read_whole_in_chunks(size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twinrun.capture import hashing

    monkeypatch.setattr(hashing, "READ_CHUNK", 7)  # many reads and a short last one
    data = bytes(range(256))[:size]
    path = tmp_path / "payload.bin"
    path.write_bytes(data)
    view = hashing.read_whole(path, "payload")
    assert bytes(view) == data and view.readonly


def test_read_whole_missing(tmp_path: Path) -> None:
    from twinrun.capture.hashing import read_whole
    from twinrun.core.errors import DataError

    with pytest.raises(DataError, match="cannot read payload"):
        read_whole(tmp_path / "absent.bin", "payload")
