"""The determinism harness's library part: run plan, metric comparison, diag localisation and
the verdict, on hand-written metrics rows and diag files (no subprocess, no torch)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from twinrun.core.errors import ConfigError, DataError, TwinrunError
from twinrun.diag.recorded import RecordedDifference
from twinrun.harness import (
    check_diag,
    compare_same_seed,
    cross_seed,
    format_verdict,
    is_ignored_metric,
    judge,
    parse_seeds,
    plan_runs,
    read_metrics,
    step0,
    substitute,
    validate_command,
)


def rows(losses: list[float], **extra: list[Any]) -> list[dict[str, Any]]:
    """Metrics rows like a training run's: loss, grad_norm, tokens, wall_s per step."""
    out = []
    for step, loss in enumerate(losses):
        row: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "lr": 0.01,
            "grad_norm": 0.5 + step,
            "tokens": 12 + step,
            "wall_s": 0.03 * (step + 1),
        }
        for k, vs in extra.items():
            row[k] = vs[step]
        out.append(row)
    return out


A = [5.123456789, 4.9, 4.7, 4.6]
C = [5.323456789, 5.0, 4.8, 4.75]  # another seed: parts by up to 0.2 (at step 0)


# ------------------------------------------------------------------------------- plan


def test_parse_seeds() -> None:
    assert parse_seeds("0,1") == (0, 1)
    assert parse_seeds(" 7 , 3 ") == (7, 3)
    for bad in ("1", "1,2,3", "a,b", "-1,2", "", str(2**63) + ",0"):
        with pytest.raises(ConfigError):
            parse_seeds(bad)
    with pytest.raises(ConfigError, match="equal"):
        parse_seeds("4,4")


def test_placeholders_are_required() -> None:
    validate_command(["train", "--seed", "{seed}", "--output={out}"])
    for cmd in ([], ["train", "--seed", "{seed}"], ["train", "--output", "{out}"], ["train"]):
        with pytest.raises(ConfigError) as info:
            validate_command(cmd)
        assert info.value.exit_code == 2


def test_plan_substitutes_each_run(tmp_path: Path) -> None:
    cmd = ["t", "--seed", "{seed}", "--output={out}", '{"json": 1}']
    plan = plan_runs(cmd, (3, 8), tmp_path)
    assert [r.label for r in plan] == ["seed-3-a", "seed-3-b", "seed-8"]
    assert [r.seed for r in plan] == [3, 3, 8]
    assert plan[0].argv == ("t", "--seed", "3", f"--output={tmp_path / 'seed-3-a'}", '{"json": 1}')
    assert plan[2].out == tmp_path / "seed-8"
    assert substitute(["{seed}{seed}"], 1, tmp_path) == ("11",)


def test_ignored_metrics() -> None:
    for name in ("wall_s", "forward_s", "local_train_wall_s", "timestamp", "peak_memory_bytes"):
        assert is_ignored_metric(name), name
    for name in ("loss", "grad_norm", "tokens", "lr", "optimizer/logical_batch_sha256", "rows"):
        assert not is_ignored_metric(name), name


# ------------------------------------------------------------------------------- comparison


def test_bit_exact_passes() -> None:
    a, b = rows(A), rows(A)
    for r in b:
        r["wall_s"] *= 3  # wall-clock fields never count
    v = judge(a, b, rows(C), tol=1e-2, seeds=(0, 1))
    assert v.passed and v.exit_code == 0 and v.fully_bit_exact
    assert v.step0.bit_exact and v.step0.loss == 5.123456789
    assert v.same_seed.max_divergence == 0.0 and v.same_seed.values_differing == 0
    assert v.cross_seed.divergence == pytest.approx(0.2) and v.cross_seed.step == 0
    lines = format_verdict(v)
    assert lines[0] == "step-0 bit-exact: yes (loss 5.123456789)"
    assert lines[1].startswith("same-seed max divergence: 0 (<= tol 0.01) — fully bit-exact")
    assert lines[2].startswith("cross-seed divergence: 2.000e-01 (> tol 0.01: distinct")
    assert lines[-1].startswith("verdict: PASS (seeds 0,1)")


def test_within_tolerance_passes_but_is_not_bit_exact() -> None:
    b = rows([A[0], A[1], A[2] + 2.67e-5, A[3] + 1e-5])
    v = judge(rows(A), b, rows(C), tol=1e-2)
    assert v.passed and not v.fully_bit_exact
    s = v.same_seed
    assert s.metric == "loss" and s.step == 2 and s.max_divergence == pytest.approx(2.67e-5)
    assert s.values_differing == 2 and s.first_difference == (2, "loss")
    text = "\n".join(format_verdict(v))
    assert "same-seed max divergence: 2.670e-05 (<= tol 0.01) at loss, step 2" in text
    assert "not bit-exact: 2 of 16 values differ, first: loss at step 2" in text
    assert "reproducible within tol 0.01" in text


def test_beyond_tolerance_fails() -> None:
    b = rows(A, grad_norm=[0.5, 1.5, 2.625, 3.5])  # parts by 0.125 at step 2
    v = judge(rows(A), b, rows(C), tol=1e-2)
    assert not v.passed and v.exit_code == 1
    assert (v.same_seed.metric, v.same_seed.step) == ("grad_norm", 2)
    assert v.same_seed.max_divergence == pytest.approx(0.125)
    assert v.failures == ["same-seed divergence 1.250e-01 exceeds tol 0.01"]
    assert format_verdict(v)[-1].startswith("verdict: FAIL (seeds 0,1) — same-seed divergence")
    assert judge(rows(A), b, rows(C), tol=0.15).passed  # a looser tolerance accepts it


def test_step0_not_bit_exact_fails() -> None:
    b = rows([A[0] + 1e-12, *A[1:]])
    v = judge(rows(A), b, rows(C), tol=1e-2)
    assert not v.step0.bit_exact and v.exit_code == 1
    assert v.failures == ["step-0 is not bit-exact"]
    assert format_verdict(v)[0] == f"step-0 bit-exact: NO ({A[0]!r} vs {A[0] + 1e-12!r})"
    # another metric at step 0 names itself
    b = rows(A, tokens=[13, 13, 14, 15])
    s0 = step0(rows(A), b)
    assert (s0.bit_exact, s0.metric, s0.a, s0.b) == (False, "tokens", 12, 13)
    assert "NO (tokens 12 vs 13)" in format_verdict(judge(rows(A), b, rows(C), tol=2))[0]


def test_cross_seed_identical_fails() -> None:
    v = judge(rows(A), rows(A), rows(A), tol=1e-2)
    assert not v.passed and v.exit_code == 1 and v.step0.bit_exact
    assert v.cross_seed.divergence == 0.0
    assert "the seed changes nothing" in v.failures[0]
    # within tolerance of each other is no better
    v = judge(rows(A), rows(A), rows([x + 1e-3 for x in A]), tol=1e-2)
    assert not v.passed and "does not exceed tol" in v.failures[0]


def test_cross_seed_without_loss_fails() -> None:
    a = [{"step": 0, "score": 1.0}]
    v = judge(a, a, [{"step": 0, "score": 2.0}], tol=1e-2)
    assert math.isnan(v.cross_seed.divergence) and not v.passed
    assert "no 'loss' metric" in v.failures[0]
    assert "cross-seed divergence: n/a" in "\n".join(format_verdict(v))


def test_missing_rows_and_metrics_diverge() -> None:
    s = compare_same_seed(rows(A), rows(A[:3]))
    assert math.isinf(s.max_divergence) and s.step == 3 and not s.bit_exact
    assert s.missing == ["step 3 (not in run b)"]
    b = rows(A)
    del b[1]["grad_norm"]
    s = compare_same_seed(rows(A), b)
    assert math.isinf(s.max_divergence) and (s.metric, s.step) == ("grad_norm", 1)
    assert not judge(rows(A), b, rows(C)).passed


def test_non_numeric_and_nan_values() -> None:
    a = rows(A, sha=["x", "y", "z", "w"])
    b = rows(A, sha=["x", "y", "Z", "w"])
    s = compare_same_seed(a, b)  # a differing string breaks bit-exactness, not the tolerance
    assert s.max_divergence == 0.0 and not s.bit_exact and s.first_difference == (2, "sha")
    nan = float("nan")
    s = compare_same_seed(rows([nan, *A[1:]]), rows([nan, *A[1:]]))
    assert s.bit_exact and s.max_divergence == 0.0
    s = compare_same_seed(rows([nan, *A[1:]]), rows(A))
    assert math.isinf(s.max_divergence)
    assert cross_seed(rows(A), rows(C)).divergence == pytest.approx(0.2)


def test_missing_metrics_is_exit_2(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        read_metrics(tmp_path)
    assert info.value.exit_code == 2 and "no metrics.jsonl" in str(info.value)
    (tmp_path / "metrics.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="no metrics rows"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n[1]\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n\n{"step": 1}\n')
    assert read_metrics(tmp_path) == [{"step": 0, "loss": 1.0}, {"step": 1}]
    with pytest.raises(DataError) as info:
        judge(rows(A), [], rows(C))
    assert isinstance(info.value, TwinrunError) and info.value.exit_code == 2


def test_bad_tolerance() -> None:
    for tol in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError):
            judge(rows(A), rows(A), rows(C), tol=tol)


def test_json_ready() -> None:
    v = judge(rows(A), rows(A[:3]), rows(C))
    d = v.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert d["exit_code"] == 1 and d["same_seed"]["max_divergence"] == "Infinity"
    assert json.loads(text)["step0"]["loss"] == 5.123456789


# ------------------------------------------------------------------------------- diag


LEAVES = ["batch.sample_indices", "forward.logits", "loss", "grads.lora"]


def write_diag(run: Path, edit: dict[tuple[int, str], tuple[float, str]] | None = None) -> Path:
    """A hand-written diag.jsonl: 4 steps, 4 leaves; `edit[(step, leaf)] = (checksum, digest)`."""
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(4):
        checks = {leaf: float(10 * step + i + 1) for i, leaf in enumerate(LEAVES)}
        digs = {leaf: f"{step}-{leaf}" for leaf in LEAVES}
        for (s, leaf), (c, d) in (edit or {}).items():
            if s == step:
                checks[leaf], digs[leaf] = c, d
        row = {"format": "twinrun.diag.v1", "step": step, "phase": "train",
               "checksums": checks, "digests": digs}  # fmt: skip
        lines.append(json.dumps(row))
    (run / "diag.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_diag_identical_and_absent(tmp_path: Path) -> None:
    assert check_diag(tmp_path / "x", tmp_path / "y") is None
    d = check_diag(write_diag(tmp_path / "a"), write_diag(tmp_path / "b"))
    assert d is not None and d.digests_equal is True and d.line is None
    assert (d.rows, d.leaves) == (4, 4)
    (tmp_path / "c").mkdir()
    d = check_diag(tmp_path / "a", tmp_path / "c")
    assert d is not None and d.present == "a" and d.digests_equal is None
    v = judge(rows(A), rows(A), rows(C), diag=d)
    assert v.passed and not v.fully_bit_exact  # informational: the checks still hold
    assert "only run a wrote diag.jsonl" in "\n".join(format_verdict(v))


def test_diag_first_divergence_line(tmp_path: Path) -> None:
    a = write_diag(tmp_path / "a")
    edit = {(2, "batch.sample_indices"): (30.0, "other"), (2, "grads.lora"): (99.0, "g"),
            (3, "grads.lora"): (77.0, "h")}  # fmt: skip
    b = write_diag(tmp_path / "b", edit)
    d = check_diag(a, b, metrics_bit_exact=False)
    assert d is not None and d.digests_equal is False and not d.bitwise
    assert d.line == (
        "FIRST_DIVERGENCE: step=2 leaf=batch.sample_indices run_A=21.0 run_B=30.0 delta=9.0"
    )
    assert d.rows_diverged == 2 and d.advice and d.advice.startswith("batch.sample_indices:")
    v = judge(rows(A), rows(A, tokens=[12, 13, 20, 15]), rows(C), diag=d)
    text = format_verdict(v)
    assert d.line in text and v.exit_code == 1


def test_diag_digest_only_falls_back_to_bitwise(tmp_path: Path) -> None:
    a = write_diag(tmp_path / "a")
    b = write_diag(tmp_path / "b", {(1, "forward.logits"): (12.0, "different-bytes")})
    d = check_diag(a, b)  # metrics bit-exact, but the digests part
    assert d is not None and d.digests_equal is False and d.bitwise
    assert d.line is not None and d.line.startswith("FIRST_DIVERGENCE: step=1 leaf=forward.logits")
    v = judge(rows(A), rows(A), rows(C), diag=d)
    assert v.passed and not v.fully_bit_exact
    assert "metrics bit-exact, diag digests differ" in format_verdict(v)[1]


def test_diag_of_two_formats_is_not_called_bit_exact(tmp_path: Path) -> None:
    """Runs whose diag files are of two formats (SHA256 and XXH3-128 digests): equal checksums,
    but no digest was compared, so the runs are not called bit-exact."""
    a = write_diag(tmp_path / "a")
    b = write_diag(tmp_path / "b")
    f = b / "diag.jsonl"
    f.write_text(f.read_text().replace("twinrun.diag.v1", "twinrun.diag.v2"))
    d = check_diag(a, b)
    assert d is not None and d.digests_equal is False and d.line is None
    v = judge(rows(A), rows(A), rows(C), diag=d)
    assert v.passed and not v.fully_bit_exact


# ------------------------------------------------------------------------------- sidecars


def test_recorded_differences_of_the_same_seed_runs(tmp_path: Path) -> None:
    """The same-seed runs' sidecars should agree: a difference is named (and the advice bearing
    on it says so first); agreement is said when the runs parted; nothing without sidecars."""
    threads = [RecordedDifference("determinism.threads", "environment", 1, 2)]
    a = write_diag(tmp_path / "a")
    b = write_diag(tmp_path / "b", {(1, "grads.lora"): (99.0, "g")})
    d = check_diag(a, b, metrics_bit_exact=False, recorded=threads)
    assert d is not None and d.advice is not None
    assert d.advice.startswith(
        "grads.lora: the runs' sidecars differ in determinism.threads (1 vs 2): reduction order"
    )
    parted = rows(A, tokens=[12, 13, 20, 15])
    v = judge(rows(A), parted, rows(C), diag=d)
    v.recorded = threads
    text = format_verdict(v)
    at = text.index(
        "sidecars: the same-seed runs' twinrun.json differ in 1 recorded fact (the command "
        "should make them agree)"
    )
    assert at == 2 and text[1].startswith("same-seed max divergence:")  # under the same-seed line
    assert text[3] == "  determinism.threads: run_a=1 run_b=2 (environment)"
    assert v.to_dict()["recorded_differences"] == [
        {"key": "determinism.threads", "section": "determinism", "kind": "environment",
         "a": 1, "b": 2},
    ]  # fmt: skip
    v.recorded = []
    assert format_verdict(v)[2] == (
        "sidecars: the same-seed runs' twinrun.json agree (no setting, input or environment "
        "difference recorded)"
    )
    assert v.to_dict()["recorded_differences"] == []
    same = judge(rows(A), rows(A), rows(C))
    same.recorded = []  # bit-exact and agreeing: nothing to say
    assert not any(ln.startswith("sidecars:") for ln in format_verdict(same))
    v.recorded = None  # no twinrun.json (not a twinrun command)
    assert not any(ln.startswith("sidecars:") for ln in format_verdict(v))
    assert v.to_dict()["recorded_differences"] is None
