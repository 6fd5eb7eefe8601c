"""Benchmark: per-epoch CPU seconds of `tune dpo` and `tune reward` at batch sizes 1, 4 and 8.

Fresh `python -m twinrun tune dpo|reward ... --threads 1` processes on the toy model
(`twinrun toy-model --seed 0`: 4 layers, hidden 64) and the 32 shipped preference pairs, f32,
chat template on, accumulation 1, lr 1e-3, warmup 0, LoRA rank 8 alpha 16, seed 1, beta 0.1
(dpo). Per-epoch CPU = (E-epoch run - 1-epoch run) / (E - 1) of the child's user + sys, so
start-up and loading cancel; medians (min-max) over repeats. `--batch-size` counts pairs (a pair
is two rows; DPO also runs the reference forward of each side with the adapter off). Each
configuration also runs with `--batch-invariant`, alternating which goes first.

    python -m bench pairs_epoch [--repeats 3] [--epochs 5] [--quick] [--render]

Writes bench/results/pairs_epoch.{json,md} and regenerates the batch_invariant section of
docs/benchmarks.md (bench/batch_invariant.py's results included).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from batch_invariant import (  # noqa: E402  (a sibling script)
    RESULTS,
    ROOT,
    fmt,
    machine,
    now,
    snapshot,
    spread,
    twinrun,
    write_section,
)

OBJECTIVES = ("dpo", "reward")
MODES = ("ordinary", "invariant")


def args_for(
    objective: str, model: Path, out: Path, batch: int, epochs: int, invariant: bool
) -> list[str]:
    args = [
        "tune",
        objective,
        "--model",
        str(model),
        "--examples",
        str(ROOT / "src" / "twinrun" / "examples" / "pairs.jsonl"),
        "--output",
        str(out),
        "--seed",
        "1",
        "--epochs",
        str(epochs),
        "--batch-size",
        str(batch),
        "--accumulation",
        "1",
        "--learning-rate",
        "1e-3",
        "--warmup-steps",
        "0",
        "--lr-schedule",
        "cosine",
        "--lora-rank",
        "8",
        "--lora-alpha",
        "16",
        "--precision",
        "f32",
        "--chat-template",
        "on",
        "--threads",
        "1",
        "--quiet",
        "--overwrite",
    ]
    if objective == "dpo":
        args += ["--beta", "0.1"]
    return args + (["--batch-invariant"] if invariant else [])


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env, sha = snapshot(work)
    model = work / "toy"
    twinrun(env, work, "toy-model", str(model), "--seed", "0")
    e = args.epochs
    rows = []
    for objective in OBJECTIVES:
        for batch in args.batch_sizes:
            cpu: dict[str, list[float]] = {m: [] for m in MODES}
            for rep in range(args.repeats):
                for mode in benchkit.alternating(MODES, rep):
                    t = {
                        k: twinrun(
                            env,
                            work,
                            *args_for(
                                objective, model, work / "out", batch, k, mode == "invariant"
                            ),
                        )[0]
                        for k in (1, e)
                    }
                    cpu[mode].append((t[e] - t[1]) / (e - 1))
                    print(
                        f"  {objective} batch {batch} {mode}: {cpu[mode][-1]:.3f} s/epoch",
                        file=sys.stderr,
                        flush=True,
                    )
            row = {
                "objective": objective,
                "batch_size": batch,
                "steps_per_epoch": -(-32 // batch),
                **{m: spread(cpu[m]) for m in MODES},
            }
            row["ratio"] = row["invariant"]["median"] / row["ordinary"]["median"]
            rows.append(row)
    return {"rows": rows, "snapshot_sha256": sha}


def markdown(res: dict[str, Any]) -> str:
    m, e = res["machine"], res["epochs"]
    lines = [
        "### Preference training: seconds per epoch at batch sizes 1, 4, 8",
        "",
        f"Measured {res['date']} by `python -m bench pairs_epoch` on {m['cpus']} CPUs "
        f"({m['cpu']}), torch {m['torch']}, Python {m['python']}, git {m['git_commit']} plus the "
        f"working tree (snapshot sha256 {res['snapshot_sha256'][:12]}); load average "
        f"{m['loadavg'][0]:.2f} at start. Toy model (hidden 64), the 32 shipped pairs, threads 1, "
        "f32, chat template on, accumulation 1, LoRA r8 on q/k/v/o, beta 0.1 (dpo). CPU seconds "
        f"per epoch = ({e}-epoch − 1-epoch) / {e - 1}, median (min–max) over {res['repeats']} "
        "repeats; fresh processes.",
        "",
        "| objective | batch (pairs) | steps/epoch | CPU s/epoch | with `--batch-invariant` "
        "| invariant / ordinary |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['objective']} | {r['batch_size']} | {r['steps_per_epoch']} "
            f"| {fmt(r['ordinary'])} | {fmt(r['invariant'])} | {r['ratio']:.2f}× |"
        )
    lines += [
        "",
        "A DPO step runs four forwards per group of pairs (chosen and rejected, each through the "
        "policy and through the reference with the adapter off) and backpropagates through the "
        "two policy forwards; reward modelling runs two forwards and the scalar head. At batch "
        "size 1 the modes do the same work (one row per forward).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 3 epochs, prints only")
    ap.add_argument("--render", action="store_true", help="re-render from the saved JSON")
    args = ap.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.render:
        res = json.loads((RESULTS / "pairs_epoch.json").read_text(encoding="utf-8"))
    else:
        if args.quick:
            args.repeats, args.epochs = 1, 3
        with tempfile.TemporaryDirectory(prefix="twinrun-pairs-") as tmp:
            res = {
                "date": now(),
                "machine": machine(),
                "repeats": args.repeats,
                "epochs": args.epochs,
                **measure(args, Path(tmp)),
            }
    body = markdown(res)
    print(body)
    if args.quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.render:
        (RESULTS / "pairs_epoch.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "pairs_epoch.md").write_text(body, encoding="utf-8")
    write_section()


if __name__ == "__main__":
    main()
