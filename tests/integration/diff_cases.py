"""Diag files for pinning `twinrun diff` output: a drifting pair, edge cases and malformed rows.

`build(root)` writes every file under `root` and returns the diff invocations (argument lists,
paths relative to `root`) whose stdout, stderr and exit code `tests/integration/diff_outputs.json`
pins. The files are written from fixed numbers (no torch, no randomness), so the outputs are the
same on every machine. `python tests/integration/diff_cases.py` rewrites the pinned file: only do
that for a change that is meant to move `twinrun diff`'s output, and say so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

FORMAT = "twinrun.diag.v1"  # most cases are files of the older format: diff still reads them
FORMAT_V2 = "twinrun.diag.v2"
LEAVES = [
    "batch.sample_indices",
    "rollout.tokens",
    "rollout.rewards",
    "rollout.advantages",
    "rollout.old_logprobs",
    "batch.tokens",
    "forward.logits",
    "loss",
    "grads.lora",
    "adam.exp_avg",
    "adam.exp_avg_sq",
    "params.lora",
    "lr",
    "rng.state",
    "replay.weights",
]
DRIFT = ("grads.lora", "adam.exp_avg", "adam.exp_avg_sq", "params.lora")
PINNED = Path(__file__).with_name("diff_outputs.json")


def digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def row(step: int, checks: dict, digs: dict | None = None, phase: str = "train") -> str:
    digs = {k: digest(step, k) for k in checks} if digs is None else digs
    obj = {"format": FORMAT, "step": step, "phase": phase, "checksums": checks, "digests": digs}
    return json.dumps(obj)


def base_checks(step: int) -> dict:
    # exact binary fractions and a few long reprs: the same floats everywhere
    return {leaf: (step + 1) * 1.25 + i / 3 for i, leaf in enumerate(LEAVES)}


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return path.name


def drifting(root: Path) -> dict[str, list[str]]:
    """30 rows × 15 leaves; run B drifts from step 10 by 1e-3 in four leaves (table > 20 rows)."""
    a, b, near = [], [], []
    for step in range(30):
        checks = base_checks(step)
        a.append(row(step, checks))
        drift = dict(checks)
        digs = {k: digest(step, k) for k in checks}
        if step >= 10:
            for leaf in DRIFT:
                drift[leaf] *= 1 + 1e-3
                digs[leaf] = digest(step, leaf, "b")
        b.append(row(step, drift, digs))
        tiny = dict(checks)
        tiny["loss"] *= 1 + 1e-9  # within the default tolerance
        near_digs = {k: digest(step, k) for k in checks}
        if step == 7:
            near_digs["batch.tokens"] = digest(step, "batch.tokens", "x")  # bytes differ only
        near.append(row(step, tiny, near_digs))
    fa = write(root / "a.jsonl", a)
    fb = write(root / "drift.jsonl", b)
    fn = write(root / "near.jsonl", near)
    run = root / "run"
    run.mkdir()
    write(run / "diag.jsonl", a)
    return {
        "identical": [fa, "run"],
        "identical_json": [fa, fa, "--json"],
        "identical_bitwise": [fa, fa, "--bitwise"],
        "drift": [fa, fb],
        "drift_json": [fa, fb, "--json"],
        "drift_bitwise": [fa, fb, "--bitwise"],
        "drift_loose": [fa, fb, "--rel-tol", "1e-2"],
        "near": [fa, fn],
        "near_strict": [fa, fn, "--rel-tol", "0", "--abs-tol", "0"],
        "near_bitwise": [fa, fn, "--bitwise", "--json"],
    }


def edges(root: Path) -> dict[str, list[str]]:
    """Phases, missing rows and leaves, non-finite and integer checksums, rows out of order,
    other row kinds, blank lines, extra keys, leaves in another order, digest-only leaves."""
    c = {"loss": 0.5, "grads.lora": 2.0, "lr": 1e-3}
    a = [
        row(0, c),
        row(0, c, phase="eval"),
        row(1, {**c, "loss": "NaN"}),
        row(2, {**c, "grads.lora": "Infinity"}),
        row(3, {**c, "loss": 7}),
        row(4, c),
        row(5, c),
        row(6, {"lr": 1e-3, "loss": 0.5, "grads.lora": 2.0}),
        row(7, {}, {}),
        row(8, c, {**{k: digest(8, k) for k in c}, "tokens": "ab" * 32}),
        row(1, {**c, "loss": 0.25}, phase="eval"),
        row(9, {}, {}),
    ]
    b = [
        "",
        row(0, c),
        json.dumps({"format": "twinrun.trace.v1", "step": 0, "entries": []}),
        row(1, {**c, "loss": "NaN"}),
        row(0, c, phase="eval"),
        row(3, {**c, "loss": 7.0}),
        row(2, {**c, "grads.lora": "Infinity"}),
        row(5, {**c, "grads.lora": 2.5}),
        row(4, {"loss": 0.5, "grads.lora": 2.0}),
        "   ",
        row(6, {"loss": 0.5, "grads.lora": 2.0, "lr": 2e-3}),
        row(7, {}, {}),
        row(8, c, {**{k: digest(8, k) for k in c}, "tokens": "cd" * 32}),
        row(1, {**c, "loss": 0.125}, phase="eval"),
        json.dumps(
            {
                "format": FORMAT,
                "step": 10,
                "phase": "train",
                "checksums": c,
                "digests": {k: digest(10, k) for k in c},
                "extra": {"x": [1, 2]},
            }
        ),  # fmt: skip
        row(2, c, phase="probe"),
    ]
    fa = write(root / "edge_a.jsonl", a)
    fb = write(root / "edge_b.jsonl", b)
    nan_a = write(root / "nan_a.jsonl", [row(0, {"loss": "NaN", "lr": "-Infinity"})])
    nan_b = write(root / "nan_b.jsonl", ['{"step": 0, "checksums": {"loss": NaN, "lr": -1e999}}'])
    nan_c = write(root / "nan_c.jsonl", [row(0, {"loss": 1.0, "lr": "Infinity"})])
    return {
        "edges": [fa, fb],
        "edges_json": [fa, fb, "--json"],
        "edges_bitwise": [fa, fb, "--bitwise"],
        "edges_reversed": [fb, fa],
        "nonfinite_equal": [nan_a, nan_b],
        "nonfinite_json": [nan_a, nan_c, "--json"],
        "nonfinite_bitwise": [nan_a, nan_b, "--bitwise"],
    }


# line 3 of a copy of a.jsonl is replaced by each of these (bytes, written as they are)
GOOD = row(2, base_checks(2))
FIRST_DIGEST = '"digests": {"batch.sample_indices": "'
MALFORMED: dict[str, bytes] = {
    "truncated": GOOD[:60].encode(),
    "not_object": b"[1, 2]",
    "step_string": GOOD.replace('"step": 2', '"step": "2"').encode(),
    "step_float": GOOD.replace('"step": 2', '"step": 2.0').encode(),
    "step_bool": GOOD.replace('"step": 2', '"step": true').encode(),
    "step_missing": GOOD.replace('"step": 2, ', "").encode(),
    "step_leading_zero": GOOD.replace('"step": 2', '"step": 02').encode(),
    "step_huge": GOOD.replace('"step": 2', '"step": ' + "9" * 41).encode(),
    "phase_empty": GOOD.replace('"phase": "train"', '"phase": ""').encode(),
    "phase_number": GOOD.replace('"phase": "train"', '"phase": 3').encode(),
    "checksums_list": GOOD.replace('"checksums": {', '"checksums": [{')
    .replace('}, "digests"', '}], "digests"')
    .encode(),  # fmt: skip
    "digests_string": (GOOD.split(', "digests"')[0] + ', "digests": "x"}').encode(),
    "format_other": GOOD.replace(FORMAT, "other.v1").encode(),
    "format_newer": GOOD.replace(FORMAT, "twinrun.diag.v9").encode(),
    "format_number": GOOD.replace('"twinrun.diag.v1"', "3").encode(),
    "checksum_text": GOOD.replace('"loss": ', '"loss": "abc", "x": ', 1).encode(),
    "checksum_null": GOOD.replace('"loss": ', '"loss": null, "x": ', 1).encode(),
    "checksum_bool": GOOD.replace('"loss": ', '"loss": true, "x": ', 1).encode(),
    "checksum_list": GOOD.replace('"loss": ', '"loss": [1], "x": ', 1).encode(),
    "checksum_huge_int": GOOD.replace('"loss": ', '"loss": ' + "1" * 41 + ', "x": ', 1).encode(),
    "checksum_leading_zero": GOOD.replace('"loss": ', '"loss": 01, "x": ', 1).encode(),
    "checksum_plus": GOOD.replace('"loss": ', '"loss": +1.0, "x": ', 1).encode(),
    "checksum_dot": GOOD.replace('"loss": ', '"loss": .5, "x": ', 1).encode(),
    "checksum_trailing_dot": GOOD.replace('"loss": ', '"loss": 1., "x": ', 1).encode(),
    "checksum_underscore": GOOD.replace('"loss": ', '"loss": 1_0, "x": ', 1).encode(),
    "checksum_word": GOOD.replace('"loss": ', '"loss": inf, "x": ', 1).encode(),
    "trailing_comma": GOOD.replace('}, "digests"', ', }, "digests"').encode(),
    "missing_colon": GOOD.replace('"loss": ', '"loss" ', 1).encode(),
    "single_quotes": GOOD.replace('"loss"', "'loss'", 1).encode(),
    "extra_data": (GOOD + " 1").encode(),
    "not_utf8": GOOD.replace('"train"', '"tr\xffin"').encode("latin-1"),
    "lone_surrogate": GOOD.replace('"loss"', '"\\ud800"', 1).encode(),
    "control_in_key": GOOD.replace('"loss"', '"lo\tss"', 1).encode(),
    "control_in_digest": GOOD.replace('": "', '": "\x01', 1).encode(),
    "too_deep": (GOOD[:-1] + ', "x": ' + "[" * 70 + "]" * 70 + "}").encode(),
    "duplicate_step": row(1, base_checks(1)).encode(),
}
# line 3 replaced by these still reads (valid JSON, same meaning or a real difference)
ODD_BUT_VALID: dict[str, bytes] = {
    "escaped_key": GOOD.replace('"loss"', '"lo\\u0073s"').encode(),
    "escaped_digest": GOOD.replace(FIRST_DIGEST, FIRST_DIGEST + "\\u0030").encode(),
    "spaces": GOOD.replace(": ", " :  ").replace(", ", " ,\t").encode(),
    "compact": json.dumps(json.loads(GOOD), separators=(",", ":")).encode(),
    "int_checksum": GOOD.replace('"lr": ', '"lr": 12, "y": ', 1).encode(),
    "exponent": GOOD.replace('"lr": ', '"lr": 1E+2, "y": ', 1).encode(),
    "duplicate_key": GOOD.replace('"loss": ', '"loss": 1.0, "loss": ', 1).encode(),
    "unicode_phase": GOOD.replace('"train"', '"tr\u00e4in"').encode(),
    "unicode_key": GOOD.replace('"loss"', '"lo\u00dfs"', 1).encode(),
    "keys_reordered": (
        '{"step": 2, "checksums": '
        + json.dumps(base_checks(2))
        + ', "phase": "train", "digests": '
        + json.dumps({k: digest(2, k) for k in LEAVES})
        + ', "format": "twinrun.diag.v1"}'
    ).encode(),
    "crlf": GOOD.encode() + b"\r",
    "big_exponent": GOOD.replace('"lr": ', '"lr": 1e999, "y": ', 1).encode(),
}


def malformed(root: Path) -> dict[str, list[str]]:
    lines = (root / "a.jsonl").read_bytes().splitlines()
    cases: dict[str, list[str]] = {}
    for name, bad in {**MALFORMED, **ODD_BUT_VALID}.items():
        p = root / f"m_{name}.jsonl"
        p.write_bytes(b"\n".join([*lines[:2], bad, *lines[3:]]) + b"\n")
        cases[f"line_{name}"] = ["a.jsonl", p.name]
        cases[f"line_{name}_as_a"] = [p.name, "a.jsonl", "--bitwise"]
    (root / "blank.jsonl").write_text("\n  \n")
    (root / "empty").mkdir()
    cases["no_rows"] = ["a.jsonl", "blank.jsonl"]
    cases["no_file"] = ["a.jsonl", "nope.jsonl"]
    cases["no_diag_in_dir"] = ["empty", "a.jsonl"]
    cases["bad_tolerance"] = ["a.jsonl", "a.jsonl", "--rel-tol", "nan"]
    return cases


def orders(root: Path) -> dict[str, list[str]]:
    """Rows out of order, two phases with more diverging rows than the table shows, leaves in
    another order, and a step recorded twice while unmatched."""
    a_lines = (root / "a.jsonl").read_text().splitlines()
    drift_lines = (root / "drift.jsonl").read_text().splitlines()
    rev = write(root / "drift_reversed.jsonl", drift_lines[::-1])
    pa, pb = [], []
    for step in range(30):
        for phase in ("eval", "train"):
            checks = base_checks(step)
            pa.append(row(step, checks, phase=phase))
            if step % 2 == 1:
                checks["loss"] += 1.0
                checks["lr"] += 1.0
            if phase == "train" and step % 2:
                checks = dict(reversed(checks.items()))  # another leaf order
            pb.append(row(step, checks, phase=phase))
    fpa = write(root / "phases_a.jsonl", pa)
    fpb = write(root / "phases_b.jsonl", pb[5:] + pb[:5])
    twice = a_lines[:2] + [a_lines[25], a_lines[25]] + a_lines[2:25] + a_lines[26:]
    ft = write(root / "twice.jsonl", twice)
    return {
        "drift_reversed": ["a.jsonl", rev],
        "drift_reversed_json": [rev, "a.jsonl", "--json"],
        "phases": [fpa, fpb],
        "phases_json": [fpa, fpb, "--json"],
        "phases_reversed": [fpb, fpa],
        "recorded_twice": ["a.jsonl", ft],
        "recorded_twice_as_a": [ft, "a.jsonl"],
    }


def formats(root: Path) -> dict[str, list[str]]:
    """The same steps written in both formats (v2's digests are 32 hex digits, of another hash):
    their checksums are compared, their digests are not; and a v2 pair whose digests differ."""

    def as_v2(name: str) -> str:
        out = []
        for line in (root / name).read_text().splitlines():
            obj = json.loads(line)
            obj["format"] = FORMAT_V2
            obj["digests"] = {k: v[:32] for k, v in obj["digests"].items()}
            out.append(json.dumps(obj))
        return write(root / f"v2_{name}", out)

    v2, v2_drift = as_v2("a.jsonl"), as_v2("drift.jsonl")
    return {
        "formats_v1_v2": ["a.jsonl", v2],
        "formats_v1_v2_bitwise": ["a.jsonl", v2, "--bitwise"],
        "formats_v1_v2_json": [v2, "a.jsonl", "--json"],
        "formats_v1_v2_drift": ["a.jsonl", v2_drift],
        "formats_v2_bitwise": [v2, v2_drift, "--bitwise"],
    }


def build(root: Path) -> dict[str, list[str]]:
    return {**drifting(root), **edges(root), **malformed(root), **orders(root), **formats(root)}


def run_all(root: Path) -> dict[str, dict]:
    """Every case's exit code, stdout and stderr (run in-process, cwd = root)."""
    import contextlib
    import io
    import os

    from twinrun.cli.main import run_cli

    cases = build(root)
    out: dict[str, dict] = {}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for name, args in cases.items():
            so, se = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                rc = run_cli(["diff", *args])
            out[name] = {"args": args, "rc": rc, "stdout": so.getvalue(), "stderr": se.getvalue()}
    finally:
        os.chdir(cwd)
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        got = run_all(Path(d))
    PINNED.write_text(json.dumps(got, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {PINNED} ({len(got)} cases)")
