"""First-divergence comparison of diag.jsonl files (twinrun.diag.compare) and the recorder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from twinrun.core.errors import DataError
from twinrun.diag.advice import GENERIC, advice_for
from twinrun.diag.compare import compare, relative_difference, values_equal
from twinrun.diag.recorder import STANDARD_LEAVES, DiagRecorder, LeafValue, leaf_value


def write_run(path: Path, steps: int = 5, edit: dict | None = None, phase: str = "train") -> Path:
    """A run's diag.jsonl: `edit` maps (step, leaf) -> value replacing the default."""
    edit = edit or {}
    with DiagRecorder(path) as rec:
        for step in range(steps):
            leaves = {
                "batch.sample_indices": torch.arange(4) + step,
                "loss": 2.0 / (step + 1),
                "grads.lora": [torch.full((3,), 0.5 + step), torch.ones(2)],
                "lr": 1e-3,
            }
            for (s, leaf), v in edit.items():
                if s == step:
                    if v is None:
                        leaves.pop(leaf)
                    else:
                        leaves[leaf] = v
            rec.record(step, leaves, phase=phase)
    return path / "diag.jsonl"


def test_recorder_rows(tmp_path: Path) -> None:
    f = write_run(tmp_path / "a", steps=2)
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    r = rows[1]
    assert r["format"] == "twinrun.diag.v2" and r["phase"] == "train"
    assert list(r["checksums"]) == ["batch.sample_indices", "loss", "grads.lora", "lr"]
    assert r["checksums"]["batch.sample_indices"] == 1 + 4 + 9 + 16
    assert r["checksums"]["grads.lora"] == 3 * 1.5**2 + 2
    assert r["checksums"]["lr"] == 1e-3**2
    assert all(len(d) == 32 for d in r["digests"].values())  # XXH3-128
    assert STANDARD_LEAVES[0] == "batch.sample_indices" and STANDARD_LEAVES[-1] == "rng.state"
    assert STANDARD_LEAVES.index("rollout.tokens") < STANDARD_LEAVES.index("batch.tokens")


def test_recorder_builder_nan_and_append(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    rec = DiagRecorder(f)
    row = rec.begin(0, "eval").add("loss", float("nan"))
    row.add_parts("params.lora", [torch.ones(2), torch.zeros(1)])
    row.add("custom", LeafValue(1.5, "ab" * 32))
    with pytest.raises(ValueError):
        row.add("loss", 1.0)
    rec.commit(row)
    rec.close()
    line = f.read_text()
    assert '"loss": "NaN"' in line  # strict JSON
    assert leaf_value([torch.ones(2), torch.zeros(1)]).checksum == 2.0
    with DiagRecorder(f, append=True) as rec2:
        rec2.record(1, {"loss": 1.0}, phase="eval")
    assert len(f.read_text().splitlines()) == 2


def test_identical(tmp_path: Path) -> None:
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    for bitwise in (False, True):
        r = compare(a, b, bitwise=bitwise)
        assert r.deterministic and r.first is None
        assert r.rows_compared == 5 and r.rows_diverged == 0 and r.values_compared == 20
        assert r.leaves == ["batch.sample_indices", "loss", "grads.lora", "lr"]
    assert compare(tmp_path / "a", tmp_path / "b").deterministic  # run directories


def test_root_cause_before_larger_downstream_effect(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    # step 2: the indices move a little, the gradients (downstream) a lot; later steps follow
    edit = {(2, "batch.sample_indices"): torch.tensor([2, 3, 4, 6])}
    for s in (2, 3, 4):
        edit[(s, "grads.lora")] = [torch.full((3,), 9.0 + s), torch.ones(2)]
    b = write_run(tmp_path / "b", edit=edit)
    r = compare(a, b, keep_matrix=True)
    assert not r.deterministic
    f = r.first
    assert (f.phase, f.step, f.leaf, f.kind) == ("train", 2, "batch.sample_indices", "value")
    assert (f.a, f.b, f.delta) == (54.0, 65.0, 11.0)
    assert [d.leaf for d in r.co_diverging] == ["grads.lora", "batch.sample_indices"]
    assert r.co_diverging[0].rel > r.co_diverging[1].rel == pytest.approx(11 / 65)
    assert r.rows_diverged == 3 and r.rows_compared == 5
    assert r.matrix is not None and r.matrix.rows[2] == ("train", 2)
    assert r.matrix.diverged[2][0] and not r.matrix.diverged[1][0]


def test_tolerance(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    loss = 2.0 / 4  # step 3
    near = write_run(tmp_path / "near", edit={(3, "loss"): loss * (1 + 1e-7)})
    far = write_run(tmp_path / "far", edit={(3, "loss"): loss * (1 + 1e-3)})
    assert compare(a, near).deterministic
    assert not compare(a, near, bitwise=True).deterministic  # the bytes differ
    r = compare(a, far)
    assert r.first.step == 3 and r.first.leaf == "loss"
    assert compare(a, far, rel_tol=1e-2).deterministic
    assert values_equal(1.0, 1.0 + 1e-6) and not values_equal(1.0, 1.0 + 1e-4)
    assert values_equal(0.0, 5e-8) and not values_equal(0.0, 5e-7)
    assert not values_equal(math.inf, 1e308) and values_equal(math.inf, math.inf)


def test_nan(tmp_path: Path) -> None:
    nan = float("nan")
    a = write_run(tmp_path / "a", edit={(1, "loss"): nan})
    b = write_run(tmp_path / "b", edit={(1, "loss"): nan})
    c = write_run(tmp_path / "c")
    assert compare(a, b).deterministic and compare(a, b, bitwise=True).deterministic
    r = compare(a, c)
    assert (r.first.step, r.first.leaf) == (1, "loss")
    assert math.isnan(r.first.a) and r.first.b == 1.0 and r.first.rel == math.inf
    assert values_equal(nan, nan) and not values_equal(nan, 1.0)
    assert relative_difference(nan, nan) == 0.0 and relative_difference(nan, 0.0) == math.inf


def test_eval_phase(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b")
    with DiagRecorder(tmp_path / "a" / "diag.jsonl", append=True) as rec:
        rec.record(4, {"loss": 0.25}, phase="eval")
    with DiagRecorder(tmp_path / "b" / "diag.jsonl", append=True) as rec:
        rec.record(4, {"loss": 0.5}, phase="eval")
    r = compare(a, b)
    assert (r.first.phase, r.first.step, r.first.leaf) == ("eval", 4, "loss")
    assert r.rows_compared == 6


def test_train_divergence_ranks_before_eval(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", edit={(4, "lr"): 2e-3})
    for p, v in ((a, 0.25), (b, 0.5)):
        with DiagRecorder(p, append=True) as rec:
            rec.record(1, {"loss": v}, phase="eval")
    r = compare(a, b)
    assert (r.first.phase, r.first.step, r.first.leaf) == ("train", 4, "lr")


def test_missing_rows(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", steps=5)
    b = write_run(tmp_path / "b", steps=3)
    r = compare(a, b)
    f = r.first
    assert (f.step, f.leaf, f.kind, f.missing_in) == (3, None, "missing_row", "B")
    assert r.rows_diverged == 2 and r.rows_compared == 5
    r = compare(b, a)
    assert r.first.missing_in == "A" and r.first.step == 3


def test_missing_leaf(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", edit={(2, "loss"): None})
    r = compare(a, b)
    f = r.first
    assert (f.step, f.leaf, f.kind, f.missing_in, f.b) == (2, "loss", "missing_leaf", "B", None)
    r = compare(b, a)
    assert (r.first.leaf, r.first.missing_in) == ("loss", "A")


def test_digest_only_difference(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    # same sum of squares, different bytes (a permutation of the indices)
    b = write_run(tmp_path / "b", edit={(1, "batch.sample_indices"): torch.tensor([4, 3, 2, 1])})
    assert compare(a, b).deterministic
    r = compare(a, b, bitwise=True)
    assert (r.first.step, r.first.leaf, r.first.kind, r.first.delta) == (
        1,
        "batch.sample_indices",
        "digest",
        0.0,
    )


def test_unreadable_inputs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    bad = tmp_path / "bad.jsonl"
    lines = a.read_text().splitlines()
    lines[2] = lines[2][:40]
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:3: not valid JSON"):
        compare(a, bad)
    with pytest.raises(DataError, match="no such file"):
        compare(a, tmp_path / "nope.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no diag.jsonl"):
        compare(a, tmp_path / "empty")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n")
    with pytest.raises(DataError, match="no diag rows"):
        compare(a, blank)
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"format": "twinrun.diag.v1", "step": "x"}) + "\n")
    with pytest.raises(DataError, match=r"wrong\.jsonl:1: 'step'"):
        compare(a, wrong)


def test_extra_keys_and_other_row_kinds_are_ignored(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = tmp_path / "b.jsonl"
    out = []
    for line in a.read_text().splitlines():
        row = json.loads(line)
        row["extra"] = {"anything": [1, 2]}
        out.append(json.dumps(row))
    out.insert(1, json.dumps({"format": "twinrun.trace.v1", "phase": "trace", "step": 0}))
    b.write_text("\n".join(out) + "\n\n")
    assert compare(a, b).deterministic


def test_advice_table() -> None:
    assert "RNG" in advice_for("batch.sample_indices").cause
    assert "generator" in advice_for("rng.state").cause
    assert "reduction order" in advice_for("grads.lora").cause
    assert "observation" in advice_for("rollout.tokens").cause
    assert advice_for("adam.exp_avg_sq").cause == advice_for("adam.exp_avg").cause
    assert advice_for("grads.lora.layer0").cause == advice_for("grads.lora").cause
    assert advice_for("my.leaf").cause == GENERIC[0]
    assert "stopped early" in advice_for(None).cause


def row_line(step: int, checks: dict, digests_text: str) -> str:
    head = json.dumps({"format": "twinrun.diag.v1", "step": step, "phase": "train",
                       "checksums": checks})  # fmt: skip
    return head[:-1] + ', "digests": ' + digests_text + "}\n"


def test_a_digest_only_leaf_is_compared_in_tolerance_mode(tmp_path: Path) -> None:
    """A leaf with a digest and no checksum: compared by digest without --bitwise too."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(row_line(0, {"loss": 1.0}, json.dumps({"loss": "0" * 64, "x": "1" * 64})))
    b.write_text(row_line(0, {"loss": 1.0}, json.dumps({"loss": "0" * 64, "x": "2" * 64})))
    r = compare(a, b)
    assert (r.first.leaf, r.first.kind) == ("x", "digest")
    assert r.leaves == ["loss", "x"]


def test_table_without_the_matrix_is_the_matrix_table(tmp_path: Path) -> None:
    """keep_table (all rows, or the first few) gives the table keep_matrix gives, counted whole:
    rows out of order, two phases, leaves in another order in some rows, missing rows."""
    from tests.integration.diff_cases import build

    build(tmp_path)
    pairs = [("phases_a.jsonl", "phases_b.jsonl"), ("a.jsonl", "drift_reversed.jsonl"),
             ("edge_a.jsonl", "edge_b.jsonl"), ("edge_b.jsonl", "edge_a.jsonl")]  # fmt: skip
    for name_a, name_b in pairs:
        a, b = tmp_path / name_a, tmp_path / name_b
        full = compare(a, b, keep_matrix=True)
        assert full.table and full.table_rows == len(full.table)
        whole = compare(a, b, keep_table=True)
        assert whole.table == full.table and whole.table_rows == len(full.table)
        for limit in (0, 1, 3, 20):
            head = compare(a, b, keep_table=True, table_limit=limit)
            assert head.table == full.table[:limit] and head.table_rows == len(full.table)
            assert head.first == full.first and head.rows_diverged == full.rows_diverged
    none = compare(tmp_path / "a.jsonl", tmp_path / "drift.jsonl")
    assert none.table is None and none.table_rows is None


def test_rows_of_two_formats_compare_checksums_not_digests(tmp_path: Path) -> None:
    """A v1 run (SHA256 digests) against a v2 run (XXH3-128) of the same steps: the digests
    cannot agree, so they are not compared; the checksums are, exactly in bitwise mode."""

    def rows(fmt: str, digest_len: int, loss: float) -> str:
        return "".join(
            json.dumps({"format": fmt, "step": s, "phase": "train",
                        "checksums": {"loss": loss + s, "lr": 1e-3},
                        "digests": {"loss": f"{s:0{digest_len}x}", "lr": "ab" * (digest_len // 2)}})
            + "\n"
            for s in range(3)
        )  # fmt: skip

    old, new = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    old.write_text(rows("twinrun.diag.v1", 64, 0.5))
    new.write_text(rows("twinrun.diag.v2", 32, 0.5))
    for bitwise in (False, True):
        r = compare(old, new, bitwise=bitwise)
        assert r.deterministic and r.digests_skipped == 3 and r.rows_compared == 3
        assert r.formats == ("twinrun.diag.v1", "twinrun.diag.v2") and r.bytes_differ == 0
        assert r.to_dict()["digests_skipped"] == 3
    moved = tmp_path / "v2_moved.jsonl"
    moved.write_text(rows("twinrun.diag.v2", 32, 0.5).replace('"loss": 2.5', '"loss": 2.5000001'))
    r = compare(old, moved, bitwise=True)
    assert r.first is not None and (r.first.step, r.first.leaf, r.first.kind) == (
        2,
        "loss",
        "value",
    )
    same = compare(new, new, bitwise=True)  # one format: digests compared, nothing skipped
    assert (
        same.deterministic and same.digests_skipped == 0 and "digests_skipped" not in same.to_dict()
    )
    differ = tmp_path / "v2_differ.jsonl"
    differ.write_text(rows("twinrun.diag.v2", 32, 0.5).replace('"lr": "abab', '"lr": "cdab'))
    r = compare(new, differ, bitwise=True)
    assert r.first is not None and (r.first.leaf, r.first.kind) == ("lr", "digest")
