"""What batching changes, measured: per-example losses at batch size 1 vs 8.

`python -m twinrun tune evaluate` (fresh processes, threads 1, no adapter, chat template off) on
the 64 shipped SFT examples, on the hidden-64 toy (`twinrun toy-model --seed 0`) and the
hidden-256 toy (`--hidden 256 --intermediate 512`), in f32 and bf16, in ordinary batching and with
`--batch-invariant`. For each: how many of the 64 per-example losses are bitwise equal between
batch size 1 and batch size 8, which differ, the largest relative difference, the first
significant digit at which a pair differs, and the corpus losses side by side.

    python -m bench batching_table [--render]

Writes bench/results/batching_table.{json,md} and the table between
`<!-- batching_table:begin -->` and `<!-- batching_table:end -->` in docs/batching.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_invariant import RESULTS, ROOT, machine, make_models, now, snapshot, twinrun  # noqa: E402
from benchkit import update_docs_section  # noqa: E402

DOC = ROOT / "docs" / "batching.md"
SIZES = (1, 8)


def first_digit(a: float, b: float) -> int | None:
    """The first significant decimal digit (1-based) at which a and b differ; None if equal."""
    if a == b:
        return None
    sa, sb = f"{a:.16e}", f"{b:.16e}"
    (ma, ea), (mb, eb) = sa.split("e"), sb.split("e")
    if ea != eb or (a < 0) != (b < 0):
        return 1
    da, db = ma.replace("-", "").replace(".", ""), mb.replace("-", "").replace(".", "")
    return next(i + 1 for i, (x, y) in enumerate(zip(da, db, strict=True)) if x != y)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def compare(one: dict[str, Any], eight: dict[str, Any]) -> dict[str, Any]:
    a = [e["loss"] for e in one["per_example"]]
    b = [e["loss"] for e in eight["per_example"]]
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    rel = [abs(a[i] - b[i]) / max(abs(a[i]), abs(b[i])) for i in diff]
    digits = [first_digit(a[i], b[i]) for i in diff]
    return {
        "examples": len(a),
        "equal": len(a) - len(diff),
        "differ_at": diff,
        "max_rel_diff": max(rel) if rel else 0.0,
        "first_digit": min(d for d in digits if d is not None) if diff else None,
        "example": (
            {"index": diff[0], "batch_1": a[diff[0]], "batch_8": b[diff[0]]} if diff else None
        ),
        "corpus": {"batch_1": one["loss"], "batch_8": eight["loss"]},
        "corpus_first_digit": first_digit(one["loss"], eight["loss"]),
    }


def measure(work: Path) -> dict[str, Any]:
    env, sha = snapshot(work)
    models = make_models(env, work)
    examples = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
    rows = []
    for mname, model in models.items():
        for precision in ("f32", "bf16"):
            for mode in ("ordinary", "batch-invariant"):
                reports = {}
                for bs in SIZES:
                    out = work / f"eval_{bs}.json"
                    twinrun(
                        env,
                        work,
                        "tune",
                        "evaluate",
                        "--model",
                        str(model),
                        "--examples",
                        str(examples),
                        "--output",
                        str(out),
                        "--batch-size",
                        str(bs),
                        "--precision",
                        precision,
                        "--chat-template",
                        "off",
                        "--threads",
                        "1",
                        "--quiet",
                        "--overwrite",
                        *(["--batch-invariant"] if mode == "batch-invariant" else []),
                    )
                    reports[bs] = json.loads(out.read_text(encoding="utf-8"))
                row = {
                    "model": mname,
                    "precision": precision,
                    "mode": mode,
                    **compare(reports[1], reports[8]),
                }
                print(f"  {mname} {precision} {mode}: {row['equal']}/64", file=sys.stderr)
                rows.append(row)
    return {"rows": rows, "snapshot_sha256": sha}


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"Measured {res['date']} by `python -m bench batching_table` on {m['cpus']} CPUs "
        f"({m['cpu']}), torch {m['torch']}, Python {m['python']}, git {m['git_commit']} plus the "
        f"working tree (snapshot sha256 {res['snapshot_sha256'][:12]}). `twinrun tune evaluate` "
        "on the 64 shipped examples (17–26 tokens each with the chat template off, so every "
        "batch of 8 is padded), no adapter, threads 1; batch size 1 against batch size 8.",
        "",
        "| model | precision | mode | equal of 64 | differ at (index) | max rel diff "
        "| first differing digit | e.g. batch 1 vs 8 | corpus loss, batch 1 "
        "| corpus loss, batch 8 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        where = ", ".join(map(str, r["differ_at"][:8])) + (" …" if len(r["differ_at"]) > 8 else "")
        ex = r["example"]
        eg = f"#{ex['index']}: {ex['batch_1']!r} vs {ex['batch_8']!r}" if ex else "—"
        digit = "—" if r["first_digit"] is None else ordinal(r["first_digit"])
        cdigit = r["corpus_first_digit"]
        c1, c8 = r["corpus"]["batch_1"], r["corpus"]["batch_8"]
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['mode']} | **{r['equal']}** | {where or '—'} "
            f"| {r['max_rel_diff']:.2e} | {digit} | {eg} | {c1!r} | {c8!r}"
            f"{'' if cdigit is None else f' (differs at digit {cdigit})'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", action="store_true", help="re-render from the saved JSON")
    args = ap.parse_args()
    if args.render:
        res = json.loads((RESULTS / "batching_table.json").read_text(encoding="utf-8"))
    else:
        with tempfile.TemporaryDirectory(prefix="twinrun-batching-") as tmp:
            res = {"date": now(), "machine": machine(), **measure(Path(tmp))}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "batching_table.json").write_text(json.dumps(res, indent=2) + "\n")
    body = markdown(res)
    print(body)
    (RESULTS / "batching_table.md").write_text(body, encoding="utf-8")
    update_docs_section("batching_table", "", "", body, docs=DOC)  # the markers are in the page


if __name__ == "__main__":
    main()
