"""Capture -> explain -> replay -> evidence, end to end on the toy model through the CLI.

On CPU a replay is bitwise identical to its source: gate B passes (source, replay and a repeated
replay end with the same adapter SHA256), and the gradient-checkpointing arm passes gate A with
the same loss. Replays never read the examples nor build the environment.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from testkit.captures import (
    Capture,
    arith,
    epoch_source,
    grpo_source,
    init_adapter,
    metrics,
    plugin,
    run_config,
    shipped,
    write_toml,
)
from twinrun.cli.main import run_cli
from twinrun.replay.identity import RUN_IDENTITY

SKIPPED = ("dataset", "environment", "rollout", "sampling")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def grpo_capture(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Capture:
    root = tmp_path_factory.mktemp("capture")
    env = plugin(root)
    init = init_adapter(root / "init", toy_model_dir)
    doc = grpo_source(toy_model_dir, arith(root), env, init, root / "source")
    assert run_config(root / "source.toml", doc) == 0
    return Capture(doc, root / "source", 0)


def forbid_data_and_environment(monkeypatch: pytest.MonkeyPatch, cap: Capture) -> None:
    """Replays must work with the examples gone and no way to build an environment."""
    Path(cap.source["data"]["examples"]).unlink(missing_ok=True)

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a replay built an environment or sampled")

    for target in (
        "twinrun.rl.environments.open_environment",
        "twinrun.train.recipes.grpo.open_environment",
        "twinrun.train.recipes.grpo.collect_rollouts",
        "twinrun.train.recipes.episodes.decode_turn",
        "twinrun.data.examples.load_rows",
    ):
        monkeypatch.setattr(target, no)


def test_source_capture_files(grpo_capture: Capture) -> None:
    out, row = grpo_capture.out, grpo_capture.row
    names = {p.name for p in out.iterdir()}
    assert {"optimizer_batch_step_000000.safetensors", "optimizer_batch_step_000000.manifest.json",
            "final", "resolved_config.json", "metrics.jsonl", "twinrun.json"} <= names  # fmt: skip
    manifest = json.loads(grpo_capture.manifest.read_text())
    assert manifest["format"] == "twinrun.optimizer-batch.v1"
    assert manifest["payload"]["sha256"] == sha(out / "optimizer_batch_step_000000.safetensors")
    assert manifest["logical_batch_sha256"] == row["optimizer/logical_batch_sha256"]
    assert row["optimizer_batch/manifest_sha256"] == sha(grpo_capture.manifest)
    init = Path(grpo_capture.source["resume"]["from"]) / "adapter_model.safetensors"
    assert row["optimizer_batch/initial_adapter_sha256"] == sha(init)
    final = out / "final" / "adapter_model.safetensors"
    assert row["optimizer_batch/final_adapter_sha256"] == sha(final) != sha(init)
    assert all(row[f"optimizer_batch/{s}_skipped"] is False for s in SKIPPED)
    # the captured row carries a replay's timing and memory fields
    for key in ("local_train_wall_s", "forward_s", "backward_s", "optimizer_s",
                "peak_memory_bytes"):  # fmt: skip
        assert isinstance(row[key], int | float) and row[key] >= 0, key
    assert row["local_train_wall_s"] == row["wall_s"]
    assert row["peak_memory_kind"] in ("process_peak_rss", "process_max_rss")
    assert json.loads((Path(grpo_capture.source["resume"]["from"]) / "trainer_state.json")
                      .read_text())["step"] == -1  # fmt: skip


def test_capture_explain_replay_twice_evidence_b(
    grpo_capture: Capture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = tmp_path / "replay.toml"
    write_toml(cfg, grpo_capture.replay_config(tmp_path / "r1"))
    capsys.readouterr()
    assert run_cli(["explain", str(cfg), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["status"] for c in report["checks"]] == ["pass"] * 7
    assert not (tmp_path / "r1").exists()  # explain writes nothing
    forbid_data_and_environment(monkeypatch, grpo_capture)
    assert run_cli(["run", str(cfg), "--quiet"]) == 0
    assert run_cli(["run", str(cfg), "--quiet", "--output", str(tmp_path / "r2")]) == 0
    src = grpo_capture.row
    for name in ("r1", "r2"):
        (row,) = metrics(tmp_path / name)
        assert all(row[f"optimizer_batch/{s}_skipped"] is True for s in SKIPPED)
        for key in ("loss", "optimizer/logical_batch_sha256", "optimizer/effective_rows_sha256",
                    "optimizer_batch/initial_adapter_sha256",
                    "optimizer_batch/final_adapter_sha256"):  # fmt: skip
            assert row[key] == src[key], key
        for key in ("local_train_wall_s", "forward_s", "backward_s", "optimizer_s",
                    "peak_memory_bytes", "padding_fraction"):  # fmt: skip
            assert row[key] >= 0, key
        assert sha(tmp_path / name / "final" / "adapter_model.safetensors") == sha(
            grpo_capture.out / "final" / "adapter_model.safetensors"
        )
    capsys.readouterr()
    rc = run_cli(["evidence", str(grpo_capture.out), str(tmp_path / "r1"), str(tmp_path / "r2"),
                  "--require", "B", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["gates"]["B"]["ok"] and report["gates"]["A"]["ok"]
    pairs = report["approximate"]["pairs"]
    assert len(pairs) == 3 and {p["relative_delta_l2"] for p in pairs} == {0.0}
    assert all(abs(p["update_cosine"] - 1) < 1e-12 for p in pairs)
    assert report["timing"]["same"]["replays"] == 2


def test_a_replay_builds_no_training_input(
    grpo_capture: Capture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay trains on the captured batch's own typed columns: no rollout, episode or
    collected batch of a training run is built (nothing with sentinel values), and the training
    recipe is never opened, prepared or collected — and the replay still ends on the source's
    adapter bytes."""
    from twinrun.train.recipes.episodes import EpisodeResult, EpisodeRun
    from twinrun.train.recipes.grpo import GrpoBatch, GrpoRecipe, Rollout

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a replay built a training run's input")

    forbid_data_and_environment(monkeypatch, grpo_capture)
    for cls in (Rollout, EpisodeRun, EpisodeResult, GrpoBatch):
        monkeypatch.setattr(cls, "__init__", no)
    for method in ("open", "prepare", "collect"):
        monkeypatch.setattr(GrpoRecipe, method, no)
    cfg = tmp_path / "replay.toml"
    write_toml(cfg, grpo_capture.replay_config(tmp_path / "r"))
    assert run_cli(["run", str(cfg), "--quiet"]) == 0
    assert sha(tmp_path / "r" / "final" / "adapter_model.safetensors") == sha(
        grpo_capture.out / "final" / "adapter_model.safetensors"
    )


def test_checkpointing_arm_passes_gate_a(
    grpo_capture: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arm = grpo_capture.replay_config(
        tmp_path / "gc",
        **{"backend.options": {"gradient_checkpointing": True},
           "optimizer_batch": {"allow_config_differences": [
               "backend.options.gradient_checkpointing"]},
           "evidence": {"min_update_cosine": 0.999, "max_relative_delta_l2": 0.01}},
    )  # fmt: skip
    assert run_config(tmp_path / "gc.toml", arm) == 0
    assert run_cli(["run", str(tmp_path / "gc.toml"), "--quiet", "--output",
                    str(tmp_path / "gc2")]) == 0  # fmt: skip
    (row,) = metrics(tmp_path / "gc")
    assert row["backend/gradient_checkpointing"] is True
    assert row["loss"] == grpo_capture.row["loss"]
    capsys.readouterr()
    rc = run_cli(["evidence", str(grpo_capture.out), str(tmp_path / "gc"), str(tmp_path / "gc2"),
                  "--require", "A"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "gate A (exact-input systems claim): PASS [required]" in out
    assert (
        "pass  repeated fresh replays: backend.options.gradient_checkpointing: 2 replays; " in out
    )
    assert "wall spread " in out
    assert "timing, source (the captured step):" in out
    assert "approximate (min_update_cosine 0.999, max_relative_delta_l2 0.01): PASS" in out
    # gate B needs a same-condition replay: with only the changed arm it cannot pass
    assert run_cli(["evidence", str(grpo_capture.out), str(tmp_path / "gc"), "--require", "B"]) == 1


def test_evidence_repeat_and_unreadable(
    grpo_capture: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "replay.toml"
    write_toml(cfg, grpo_capture.replay_config(tmp_path / "r"))
    capsys.readouterr()
    rc = run_cli(["evidence", str(grpo_capture.out), "--repeat", "2", str(cfg), "--require", "A",
                  "--require", "B", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert [Path(r["path"]).name for r in report["replays"]] == ["r.repeat-1", "r.repeat-2"]
    assert run_cli(["evidence", str(grpo_capture.out), str(tmp_path / "missing")]) == 2


def test_capture_steps_inside_a_longer_run(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 1 of a 3-step run (no init state needed): replay starts from the pinned adapter and
    AdamW state and matches the source's adapter after step 1 bit for bit."""
    doc = grpo_source(toy_model_dir, arith(tmp_path), plugin(tmp_path), None, tmp_path / "src")
    doc["training"]["max_steps"] = 3
    doc["optimizer_batch"]["capture_steps"] = [1]
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 1)
    state = tmp_path / "src" / "optimizer_batch_step_000001.state"
    assert json.loads((state / "trainer_state.json").read_text())["step"] == 0
    assert (state / "optimizer.safetensors").is_file()
    replay = cap.replay_config(tmp_path / "rep", resume={"from": str(state)})
    assert run_config(tmp_path / "rep.toml", replay) == 0
    (row,) = metrics(tmp_path / "rep")
    assert row["step"] == 1 and row["lr"] == cap.row["lr"]
    assert (
        row["optimizer_batch/final_adapter_sha256"]
        == cap.row["optimizer_batch/final_adapter_sha256"]
    )
    capsys.readouterr()
    assert run_cli(["evidence", str(cap.out), str(tmp_path / "rep"), "--require", "B"]) == 0
    capsys.readouterr()
    # gate A refuses a single replay (no spread), the same replay given twice, a replay copied
    # under another name (its run id is the original's) and one without a run id
    rep = str(tmp_path / "rep")
    shutil.copytree(rep, tmp_path / "rep-copy")
    shutil.copytree(rep, tmp_path / "rep-no-id")
    (tmp_path / "rep-no-id" / RUN_IDENTITY).unlink()
    for given, detail in (
        ([rep], "same: 1 replay (at least 2 fresh replays needed: twinrun evidence --repeat"),
        ([rep, rep], f"a replay directory is given more than once: {tmp_path.resolve() / 'rep'}"),
        ([rep, str(tmp_path / "rep-copy")], f"{tmp_path / 'rep-copy'} is a copy of {rep} "),
        ([rep, str(tmp_path / "rep-no-id")], f"{tmp_path / 'rep-no-id'} has no run identity"),
    ):
        rc = run_cli(["evidence", str(cap.out), *given, "--require", "A", "--json"])
        report = json.loads(capsys.readouterr().out)
        failed = [c for c in report["gates"]["A"]["criteria"] if not c["ok"]]
        assert rc == 1 and not report["gates"]["A"]["ok"]
        assert [c["name"] for c in failed] == ["repeated fresh replays"]
        assert failed[0]["detail"].startswith(detail)


@pytest.mark.parametrize(
    ("trainer", "examples"),
    [("sft", "sft.jsonl"), ("dpo", "pairs.jsonl"), ("reward", "pairs.jsonl")],
)
def test_epoch_objectives_capture_and_replay_bitwise(
    trainer: str, examples: str, tmp_path: Path, toy_model_dir: Path
) -> None:
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    data = shipped(examples, tmp_path)
    doc = epoch_source(trainer, toy_model_dir, init, tmp_path / "src", data)
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 0)
    data.unlink()
    assert run_config(tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep")) == 0
    (row,) = metrics(tmp_path / "rep")
    for key in ("loss", "optimizer/logical_batch_sha256", "optimizer/effective_rows_sha256",
                "optimizer_batch/final_adapter_sha256"):  # fmt: skip
        assert row[key] == cap.row[key], key
    if trainer == "reward":
        head = "reward_head.safetensors"
        assert sha(tmp_path / "rep" / "final" / head) == sha(tmp_path / "src" / "final" / head)


def test_redaction_canary(tmp_path: Path, toy_model_dir: Path) -> None:
    """Secrets in [environment.args] (nested, URL userinfo, query tokens) and in a path reach no
    file that the source run or its replay writes."""
    secrets = ["sk-CANARY-1", "CANARY-pass-2", "CANARY-tok-3", "CANARY-nested-4", "CANARY-q-5"]
    examples_dir = tmp_path / "data?token=CANARY-q-5"
    examples_dir.mkdir()
    init = init_adapter(tmp_path / "init", toy_model_dir)
    doc = grpo_source(toy_model_dir, arith(examples_dir), plugin(tmp_path), init, tmp_path / "src")
    doc["environment"]["args"] = {
        "api_key": "sk-CANARY-1",
        "endpoint": "https://alice:CANARY-pass-2@example.org/v1?token=CANARY-tok-3&page=2",
        "nested": {"password": "CANARY-nested-4", "level": 3},
    }
    doc["logging"]["diag"] = True
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 0)
    assert run_config(tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep")) == 0
    written = [p for d in ("src", "rep") for p in (tmp_path / d).rglob("*") if p.is_file()]
    assert len(written) > 10
    for path in written:
        data = path.read_bytes()
        leaked = [s for s in secrets if s.encode() in data]
        assert not leaked, f"{path} holds {leaked}"


def test_reward_step_inside_a_run_restores_head_and_adam(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    """Step 1 of a 2-step reward run: the replay starts from the captured adapter, reward head
    and AdamW state, and ends with the source's adapter and head after step 1."""
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    doc = epoch_source(
        "reward", toy_model_dir, init, tmp_path / "src", shipped("pairs.jsonl", tmp_path)
    )
    doc["training"] |= {"accumulation": 1, "max_steps": 2, "warmup_steps": 1}
    doc["optimizer_batch"]["capture_steps"] = [1]
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 1)
    state = tmp_path / "src" / "optimizer_batch_step_000001.state"
    assert {p.name for p in state.iterdir()} >= {"reward_head.safetensors", "optimizer.safetensors"}
    assert (
        run_config(
            tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep", resume={"from": str(state)})
        )
        == 0
    )
    (row,) = metrics(tmp_path / "rep")
    assert row["loss"] == cap.row["loss"]
    assert (
        row["optimizer_batch/final_adapter_sha256"]
        == cap.row["optimizer_batch/final_adapter_sha256"]
    )
    head = "reward_head.safetensors"
    after = tmp_path / "src" / "optimizer_batch_step_000001.final"
    assert sha(tmp_path / "rep" / "final" / head) == sha(after / head)
    assert sha(after / head) != sha(state / head)


def test_a_replay_refuses_a_base_that_cannot_fit_before_hashing_it(
    grpo_capture: Capture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The memory refusal comes from the weights' headers, before the checks hash the base (an
    instrumented hasher and span reader count no byte of it)."""
    from tests.unit.model.test_shards import Counted
    from twinrun.model import shards

    model = Path(grpo_capture.source["model"]["path"])
    monkeypatch.setattr(shards, "data_limit_bytes", lambda: (10_000, "RLIMIT_DATA"))
    counted = Counted(monkeypatch, model)
    out = tmp_path / "replay"
    assert run_config(tmp_path / "replay.toml", grpo_capture.replay_config(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("twinrun: error: the base needs 0.00 GB; this process may use"), err
    assert counted.hashed == 0 and counted.spans == 0
    assert not out.exists()


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_a_capture_of_another_schedule_explains_and_replays(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str], schedule: str
) -> None:
    """Step 1 of a 3-step run whose schedule is not cosine (its lr there is not cosine's): the
    replay's recomputed learning rate is the source's, in `explain` and in the replay alike."""
    doc = grpo_source(toy_model_dir, arith(tmp_path), plugin(tmp_path), None, tmp_path / "src")
    doc["training"] |= {"max_steps": 3, "lr_schedule": schedule}
    doc["optimizer_batch"]["capture_steps"] = [1]
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 1)
    base = doc["training"]["learning_rate"]
    assert cap.row["lr"] == (base if schedule == "constant" else base * 2 / 3)  # not 0.5 * base
    state = tmp_path / "src" / "optimizer_batch_step_000001.state"
    replay = cap.replay_config(tmp_path / "rep", resume={"from": str(state)})
    write_toml(tmp_path / "rep.toml", replay)
    capsys.readouterr()
    assert run_cli(["explain", str(tmp_path / "rep.toml")]) == 0, capsys.readouterr()
    assert run_config(tmp_path / "rep.toml", replay) == 0
    (row,) = metrics(tmp_path / "rep")
    assert row["lr"] == cap.row["lr"]
