"""Issue 6 figures: per-step time with --prefetch 0 vs 4, checkpoint write time and size, and
resume start-up time. Writes bench/results/resume_prefetch.{json,md} and the section of
docs/benchmarks.md between `<!-- resume_prefetch:begin -->` and `<!-- resume_prefetch:end -->`.

    python -m bench resume_prefetch [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchkit
from benchkit import update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
DOCS = ROOT / "docs" / "benchmarks.md"
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"


def twinrun(*args: str, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "twinrun", *args], check=True,
                   env=os.environ | (env or {}))  # fmt: skip
    return time.perf_counter() - t0


def sft(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "tune", "sft", "--model", str(model), "--examples", str(EXAMPLES), "--output", str(out),
        "--seed", "1", "--epochs", "2", "--batch-size", "8", "--accumulation", "1",
        "--learning-rate", "1e-3", "--warmup-steps", "0",
        "--lr-schedule", "cosine", "--lora-rank", "8", "--lora-alpha",
        "16", "--precision", "f32", "--chat-template", "on", "--threads", "1", "--quiet",
        "--overwrite", *extra,
    ]  # fmt: skip


def step_times(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["wall_s"] for r in rows[1:]]  # step 0 carries warm-up


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def fmt(d: dict[str, float], unit: str = "", scale: float = 1.0) -> str:
    return f"{d['median'] * scale:.3g}{unit} ({d['min'] * scale:.3g}–{d['max'] * scale:.3g})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="twinrun-bench-"))
    model = tmp / "toy"
    twinrun("toy-model", str(model), "--seed", "0")

    per_step: dict[int, list[float]] = {0: [], 4: []}
    for r in range(args.repeats):
        for depth in (0, 4) if r % 2 == 0 else (4, 0):
            out = tmp / f"p{depth}-{r}"
            twinrun(*sft(model, out, "--prefetch", str(depth)))
            per_step[depth] += step_times(out)
    ratio = statistics.median(per_step[4]) / statistics.median(per_step[0])

    ckpt = tmp / "ckpt"
    twinrun(*sft(model, ckpt, "--checkpoint-every", "1"))
    from safetensors.torch import load_file  # noqa: F401  (the venv is the project's)

    sizes = [sum(f.stat().st_size for f in d.iterdir())
             for d in (ckpt / "checkpoints").glob("step-*")]  # fmt: skip
    write_s: list[float] = []
    code = (
        "import sys,time,torch; from twinrun.train.outputs.checkpoint import write_checkpoint;"
        "from twinrun.model.build import load_causal_lm; from twinrun.model.lora import "
        "apply_lora, lora_parameters; torch.set_num_threads(1); m=load_causal_lm(sys.argv[1]);"
        "apply_lora(m,8,16.0,1); p=lora_parameters(m); o=torch.optim.AdamW([x for _,x in p],"
        "foreach=False); [x.grad.__init__() if False else None for _,x in p];"
        "loss=sum((x*x).sum() for _,x in p); loss.backward(); o.step(); ts=[]\n"
        "for i in range(20):\n t=time.perf_counter(); write_checkpoint(__import__('pathlib')"
        ".Path(sys.argv[2]),i+1,p,o,{'train':{},'metrics':[]}); ts.append(time.perf_counter()-t)\n"
        "print(' '.join(map(str,ts)))"
    )
    res = subprocess.run([sys.executable, "-c", code, str(model), str(tmp / "wck")],
                         check=True, capture_output=True, text=True)  # fmt: skip
    write_s = [float(x) for x in res.stdout.split()]

    # resume start-up: a process resuming with one step left vs a fresh process doing one step
    resume_s, fresh_s = [], []
    one_left = tmp / "oneleft"
    twinrun(*sft(model, one_left, "--checkpoint-every", "1"))
    last = sorted((one_left / "checkpoints").glob("step-*"))[-1]
    for _ in range(args.repeats):
        for name in ("twinrun.json", "metrics.jsonl", "adapter_model.safetensors"):
            (one_left / name).unlink(missing_ok=True)
        resume_s.append(twinrun(*sft(model, one_left, "--checkpoint-every", "1", "--resume")))
        args1 = sft(model, tmp / "fresh1", "--checkpoint-every", "1")
        args1[args1.index("--epochs") + 1] = "1"
        args1[args1.index("--batch-size") + 1] = "64"  # one step
        fresh_s.append(twinrun(*args1))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_start": load0,
            "load_end": os.getloadavg()[0],
        },  # fmt: skip
        "per_step_s": {
            "prefetch_0": spread(per_step[0]),
            "prefetch_4": spread(per_step[4]),
            "ratio_4_over_0": ratio,
        },  # fmt: skip
        "checkpoint": {
            "write_s": spread(write_s),
            "bytes": statistics.median(sizes),
            "files": sorted(p.name for p in last.iterdir()),
        },  # fmt: skip
        "resume": {
            "resume_one_step_process_s": spread(resume_s),
            "fresh_one_step_process_s": spread(fresh_s),
        },  # fmt: skip
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "resume_prefetch.json").write_text(json.dumps(result, indent=2) + "\n")
    ps, rs = result["per_step_s"], result["resume"]
    md = "\n".join([
        f"Measured {result['date']} by `python -m bench resume_prefetch` on {os.cpu_count()} "
        f"CPUs; load average {load0:.2f} at start, {result['machine']['load_end']:.2f} at end. "
        "Toy model, 64 shipped examples, batch 8, 2 epochs, threads 1; median (min–max).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| per-step wall, --prefetch 0 | {fmt(ps['prefetch_0'], ' ms', 1e3)} |",
        f"| per-step wall, --prefetch 4 | {fmt(ps['prefetch_4'], ' ms', 1e3)} |",
        f"| prefetch 4 / prefetch 0 | **{ratio:.3f}** |",
        f"| checkpoint write (LoRA r8 + AdamW state, fsynced) | "
        f"{fmt(result['checkpoint']['write_s'], ' ms', 1e3)} |",
        f"| checkpoint size | {result['checkpoint']['bytes'] / 1024:.1f} KiB |",
        f"| process resuming with 1 step left | {fmt(rs['resume_one_step_process_s'], ' s')} |",
        f"| fresh process doing 1 step | {fmt(rs['fresh_one_step_process_s'], ' s')} |",
        "",
        "Prefetch prepares padding and tensors ahead; tokenisation happens once at start-up, so on "
        "the toy model there is little left to overlap — the bytes are identical either way "
        "(tests/integration/test_resume.py).",
    ])  # fmt: skip
    (RESULTS / "resume_prefetch.md").write_text(md + "\n")
    update_docs_section(
        "resume_prefetch",
        "Checkpoints, resume and prefetch",
        "Generated by `python -m bench resume_prefetch` (also in "
        "`bench/results/resume_prefetch.md`); do not edit between the markers.",
        md,
    )
    print(md)


if __name__ == "__main__":
    main()
