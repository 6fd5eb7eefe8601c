"""Long rows for every objective: peak RSS of one SmolLM2-135M training step per objective at
2,048 and 8,192 tokens, `--attention blockwise --gradient-checkpointing`.

Each objective's output head and loss run on position chunks (`twinrun.model.head_chunks`): no
[B, T, V] logits are kept (SmolLM2's 49,152-token vocabulary: 1.6 GB per float32 copy at 8,192
tokens). Each (objective, length) is one fresh `twinrun tune OBJECTIVE` process of one optimizer
step of one row (one pair for dpo, ipo, simpo and reward: a chosen and a rejected forward, and
the reference's two no-grad forwards for dpo and ipo); peak RSS is the process's `ru_maxrss`
(`os.wait4`). The rows: a prompt of repeated one-token words and a five-word completion
(`utilisation.exact_rows`, chat template off), T tokens in all; the pairs share the prompt, their
rejected side another five words. GRPO: a T-token prompt (its rollout prefill makes the last
position's logits only), two sampled completions of at most 8 tokens, and the update over the
prompt-and-completion rows (the head runs on the kept completion positions alone).

Goal (issue 52): at most 2 GB at 2,048 tokens and 4 GB at 8,192, as SFT. The short-row bytes of
every objective are pinned by tests/integration/test_pinned_bytes.py and
tests/integration/test_long_rows.py: chunking writes them unchanged.

Writes bench/results/long_rows_memory.json and .md and the `long_rows_memory` section of
docs/benchmarks.md. `--quick`: 64 and 128 tokens, prints only. `--lengths` picks the lengths,
`--objectives` the objectives (measured in the order given), `--eager` adds eager-attention rows
at the first length. `--add` keeps the rows of the results file this run does not measure
again (each row records the commit and time it was measured at) and writes the results after
every row, so a run of hours can be split or stopped without losing what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from benchkit import meta, smollm2_dir, update_docs_section, verdict, write_results  # noqa: E402
from utilisation import ALPHA, LR, RANK, SEED, child_env, exact_rows, run_child  # noqa: E402

sys.path.insert(0, str(benchkit.ROOT))
from testkit.toy_runs import SHAPED_ENV, SHAPED_MODULE  # noqa: E402 (the GRPO environment)

NAME = "long_rows_memory"
LENGTHS = (2048, 8192)
OBJECTIVES = ("sft", "dpo", "ipo", "simpo", "reward", "grpo")
GOAL_MIB = {2048: 2048, 8192: 4096}  # issue 52: <= 2 GB at 2,048 tokens, <= 4 GB at 8,192
MMAP_THRESHOLD = 1 << 20  # what a blockwise run sets itself (docs/training.md)


def write_data(model: Path, work: Path, seq: int) -> dict[str, Path]:
    """Per objective, one row (or pair) of about `seq` tokens."""
    sft = exact_rows(model, work / f"sft-{seq}.jsonl", 1, seq)
    row = json.loads(sft.read_text(encoding="utf-8").splitlines()[0])
    pairs = work / f"pairs-{seq}.jsonl"
    rejected = " ".join(["plum"] * 5)
    pairs.write_text(json.dumps({"prompt": row["prompt"], "chosen": row["completion"],
                                 "rejected": rejected}) + "\n", encoding="utf-8")  # fmt: skip
    prompts = work / f"prompts-{seq}.jsonl"
    prompts.write_text(json.dumps({"prompt": row["prompt"]}) + "\n", encoding="utf-8")
    (work / f"{SHAPED_MODULE}.py").write_text(SHAPED_ENV, encoding="utf-8")
    return {"sft": sft, "dpo": pairs, "ipo": pairs, "simpo": pairs, "reward": pairs,
            "grpo": prompts}  # fmt: skip


def tune_args(
    objective: str, model: Path, data: Path, out: Path, seq: int, attention: str, threads: int
) -> list[str]:
    """One optimizer step of `objective` on one row (pair, prompt)."""
    args = ["tune", objective, "--model", str(model), "--examples", str(data), "--output",
            str(out), "--seed", str(SEED), "--learning-rate", str(LR), "--warmup-steps", "0",
            "--lr-schedule", "cosine", "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA),
            "--precision", "f32", "--chat-template", "off", "--max-length", str(seq + 16),
            "--threads", str(threads), "--cpu-kernels", "native", "--attention", attention,
            "--batch-size", "1", "--quiet"]  # fmt: skip
    if attention == "blockwise":
        args.append("--gradient-checkpointing")
    if objective == "grpo":
        return args + [
            "--steps", "1", "--prompts-per-step", "1", "--group-size", "2",
            "--max-new-tokens", "8", "--temperature", "1.0", "--clip-eps", "0.2",
            "--advantage-clip", "5", "--token-cap", "8", "--env", f"{SHAPED_MODULE}:make",
        ]  # fmt: skip
    args += ["--epochs", "1", "--accumulation", "1"]
    if objective == "simpo":
        return args + ["--beta", "2.0", "--gamma", "0.5"]
    return args + (["--beta", "0.1"] if objective in ("dpo", "ipo") else [])


def measure_one(
    objective: str, model: Path, data: Path, work: Path, seq: int, attention: str, threads: int
) -> dict[str, Any]:
    out = work / f"{objective}-{seq}-{attention}"
    cmd = [sys.executable, "-m", "twinrun",
           *tune_args(objective, model, data, out, seq, attention, threads)]  # fmt: skip
    env = child_env(threads)
    env["PYTHONPATH"] += os.pathsep + str(work)  # the GRPO plugin
    if attention == "blockwise":
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    wall, cpu, rss = run_child(cmd, env)
    mib = rss / 2**20
    row = {"objective": objective, "seq": seq, "attention": attention, "peak_rss_mib": mib,
           "process_s": wall, "process_cpu_s": cpu, "when": benchkit.now(),
           "git_commit": benchkit.git("rev-parse", "--short", "HEAD")}  # fmt: skip
    print(f"  {objective} {seq} ({attention}): {mib:.0f} MiB, {wall:.0f} s", file=sys.stderr,
          flush=True)  # fmt: skip
    return row


def table(rows: list[dict[str, Any]], lengths: tuple[int, ...]) -> list[str]:
    attentions = sorted({r["attention"] for r in rows}, key=lambda a: a != "blockwise")
    head = " | ".join(f"{t:,} tokens" for t in lengths)
    lines = [f"| objective | attention | {head} |", "|---|---|" + "---|" * len(lengths)]
    for objective in OBJECTIVES:
        for attention in attentions:
            got = {r["seq"]: r for r in rows if r["objective"] == objective
                   and r["attention"] == attention}  # fmt: skip
            if not got:
                continue
            cells = []
            for t in lengths:
                r = got.get(t)
                goal = GOAL_MIB.get(t)
                mark = "" if r is None or goal is None or r["peak_rss_mib"] <= goal else " ⚠"
                cells.append("—" if r is None else f"{r['peak_rss_mib']:.0f} MiB{mark}")
            lines.append(f"| {objective} | {attention} | {' | '.join(cells)} |")
    return lines


def render(res: dict[str, Any]) -> str:
    m = res["meta"]
    lengths = tuple(res["lengths"])
    commits = sorted({r.get("git_commit", m["git_commit"]) for r in res["rows"]})
    when = (
        f"commit {m['git_commit']}"
        if commits == [m["git_commit"]]
        else f"rows measured at commits {', '.join(commits)} (`--add`; each row's in the JSON)"
    )
    intro = (
        f"Measured {m['when']} by `python -m bench long_rows_memory` on {m['cpu_count']} CPUs "
        f"({m['cpu']}), torch {m.get('torch')}, {when}; load average "
        f"{m['load_avg_start']:.2f} at start, {m['load_avg_end']:.2f} at end. SmolLM2-135M, f32, "
        f"LoRA rank {RANK}, `--cpu-kernels native`, {res['threads']} thread(s), one optimizer "
        "step of one row (one pair; GRPO: one prompt, two completions of at most 8 tokens) per "
        "fresh process; peak RSS is the process's `ru_maxrss`. Blockwise rows run with "
        "`--gradient-checkpointing` and glibc's mmap threshold at 1 MiB (what a blockwise run "
        "sets itself). Goal: at most 2,048 MiB at 2,048 tokens and 4,096 MiB at 8,192 "
        f"(⚠ where not met): **{res['verdict']}** for the lengths measured."
    )
    return "\n".join([intro, "", *table(res["rows"], lengths)]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 and 128 tokens; prints only")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    ap.add_argument("--eager", action="store_true", help="eager rows at the first length too")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--add", action="store_true",
                    help="keep the results' other rows; write after every row")  # fmt: skip
    args = ap.parse_args()
    lengths = (64, 128) if args.quick else tuple(args.lengths)
    load_start = os.getloadavg()[0]
    model = smollm2_dir()
    kept = earlier_rows(args.threads) if args.add and not args.quick else []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="twinrun-long-rows-") as tmp:
        work = Path(tmp)
        plans = [(t, "blockwise") for t in lengths]
        plans += [(lengths[0], "eager")] if args.eager else []
        for seq, attention in plans:
            data = write_data(model, work, seq)
            for objective in args.objectives:
                rows.append(
                    measure_one(objective, model, data[objective], work, seq, attention,
                                args.threads)
                )  # fmt: skip
                if args.add:
                    write(merged(kept, rows), load_start, args.threads, quiet=True)
    write(merged(kept, rows), load_start, args.threads, quiet=args.quick, only_print=args.quick)


def key(row: dict[str, Any]) -> tuple[str, int, str]:
    return row["objective"], row["seq"], row["attention"]


def earlier_rows(threads: int) -> list[dict[str, Any]]:
    """The rows of the results file (at the same thread count), for `--add`."""
    path = benchkit.RESULTS / f"{NAME}.json"
    if not path.exists():
        return []
    res = json.loads(path.read_text(encoding="utf-8"))
    if res.get("threads") != threads:
        sys.exit(f"{NAME}: --add at {threads} thread(s), the results were at {res.get('threads')}")
    return [r | {"git_commit": r.get("git_commit", res["meta"]["git_commit"]),
                 "when": r.get("when", res["meta"]["when"])} for r in res["rows"]]  # fmt: skip


def merged(kept: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`kept` with the rows measured now in place of theirs."""
    fresh = {key(r) for r in rows}
    return [r for r in kept if key(r) not in fresh] + rows


def write(
    rows: list[dict[str, Any]], load_start: float, threads: int, quiet: bool,
    only_print: bool = False,
) -> None:  # fmt: skip
    """The results of `rows` (every length any row has), and the docs section."""
    lengths = sorted({r["seq"] for r in rows})
    met = all(r["peak_rss_mib"] <= GOAL_MIB[r["seq"]] for r in rows
              if r["attention"] == "blockwise" and r["seq"] in GOAL_MIB)  # fmt: skip
    res = {
        "meta": meta(load_start, "torch", "transformers"), "lengths": lengths,
        "threads": threads, "goal_mib": GOAL_MIB, "verdict": verdict(met), "rows": rows,
    }  # fmt: skip
    md = render(res)
    if not quiet:
        print(md)
    if only_print:
        return
    write_results(NAME, res, f"# {NAME}\n\n{md}")
    update_docs_section(NAME, "Long rows for every objective — peak RSS per objective", "", md,
                        benchkit.DOCS)  # fmt: skip


if __name__ == "__main__":
    main()
