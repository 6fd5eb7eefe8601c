"""The full hostile sweep: what a new user and an attacker would try, counted.

`python -m bench hostile_sweep [--per-parser 1500] [--kills 6] [--seed 0] [--quick]`

1. inputs: every parser of a user-supplied file (testkit/hostile.py) fed the hostile snippets,
   random bytes and seeded mutations of valid files; an outcome other than a result or one
   twinrun error line is an internal error;
2. flips: a real capture (toy model, GRPO, one step) and, for every file its replay reads, a
   flipped byte at several offsets: `twinrun explain` and `twinrun run` must both refuse;
3. crashes: SFT runs SIGKILLed at seeded random moments (and mid-checkpoint-write), then
   `--resume`d: the adapter, metrics and diag.jsonl must equal an uninterrupted run's;
4. reads: every command that reads a user's file handed a FIFO, /dev/zero and a directory
   (and a chat template that loops or builds gigabytes), each in a process with a timeout: one
   line and exit 2, never a hang or a read without end;
5. canaries: a secret passed as an --env-arg value, URL userinfo, a secret query value and a
   secret-named flag, through `check --json` and failing commands: grepped in every line printed
   and every file written;
6.-10. overwrite of foreign directories, outputs refused before the work, flag-value canaries,
   flipped checkpoint bytes on resume, copied replay directories at gate A: see
   `bench/hostile_reliability.py`.

`--quick` runs every section with small counts (a minute or two, not five).

Writes bench/results/hostile_sweep.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench import benchkit  # noqa: E402
from bench import hostile_reliability as rel  # noqa: E402
from testkit.hostile import HOSTILE, PARSERS, mutate, outcome, seeds  # noqa: E402

RESULTS = benchkit.RESULTS
CANARY = "CANARY5e1d0"


def twinrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                          text=True, env=os.environ | (env or {}))  # fmt: skip


def sweep_inputs(per_parser: int, rng: random.Random) -> dict[str, Any]:
    valid = seeds()
    tried, internal, examples = 0, 0, []
    by_parser: dict[str, dict[str, int]] = {}
    for parser in sorted(PARSERS):
        counts = {"ok": 0, "refused": 0, "internal": 0}
        inputs = list(HOSTILE)
        inputs += [rng.randbytes(rng.randrange(0, 600)) for _ in range(per_parser // 5)]
        while len(inputs) < per_parser + len(HOSTILE):
            base = rng.choice(valid[parser])
            ops = [(rng.randrange(4), rng.randrange(1 << 16), rng.randrange(1 << 16))
                   for _ in range(rng.randrange(1, 7))]  # fmt: skip
            inputs.append(mutate(base, ops))
        for data in inputs:
            result = outcome(parser, data)
            kind = "internal" if result.startswith("internal") else result
            counts[kind] += 1
            if kind == "internal" and len(examples) < 20:
                examples.append({"parser": parser, "input": data[:120].hex(), "error": result})
        tried += len(inputs)
        internal += counts["internal"]
        by_parser[parser] = counts
    return {"inputs_tried": tried, "internal_errors": internal, "by_parser": by_parser,
            "internal_examples": examples}  # fmt: skip


def make_capture(work: Path, model: Path) -> tuple[Path, dict[str, Any]]:
    from testkit.captures import Capture, arith, grpo_source, write_toml

    init = work / "init"
    res = twinrun("init-adapter", str(init), "--model", str(model), "--seed", "7",
                  "--lora-rank", "4", "--lora-alpha", "8")  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = grpo_source(model, arith(work), "arithmetic", init, work / "source")
    write_toml(work / "source.toml", doc)
    res = twinrun("run", str(work / "source.toml"), "--quiet")
    assert res.returncode == 0, res.stderr
    cap = Capture(doc, work / "source", 0)
    return init, cap.replay_config(work / "replay")


def sweep_flips(
    work: Path, init: Path, doc: dict[str, Any], rng: random.Random, per_file: int
) -> dict[str, Any]:
    from testkit.captures import write_toml

    source = work / "source"
    manifest = Path(doc["optimizer_batch"]["replay_path"])
    files = [manifest, source / "optimizer_batch_step_000000.safetensors",
             *sorted(p for p in init.iterdir() if p.is_file())]  # fmt: skip
    write_toml(work / "replay.toml", doc)
    ok = twinrun("explain", str(work / "replay.toml"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    tried = refused = 0
    missed = []
    for path in files:
        original = path.read_bytes()
        for _ in range(per_file):
            data = bytearray(original)
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            out = work / "replay"
            shutil.rmtree(out, ignore_errors=True)
            ex = twinrun("explain", str(work / "replay.toml"))
            run = twinrun("run", str(work / "replay.toml"), "--quiet")
            tried += 1
            if ex.returncode != 0 and run.returncode == 2 and "internal" not in run.stderr:
                refused += 1
            else:
                missed.append({"file": path.name, "offset": i, "explain": ex.returncode,
                               "run": run.returncode})  # fmt: skip
            path.write_bytes(original)
    return {"files": [p.name for p in files], "flips_tried": tried, "flips_refused": refused,
            "not_refused": missed}  # fmt: skip


def sweep_kills(work: Path, model: Path, rng: random.Random, kills: int) -> dict[str, Any]:
    from testkit.toy_runs import sft_args
    from twinrun.data.examples import shipped_examples

    ex = work / "ex.jsonl"
    ex.write_text("\n".join(shipped_examples("sft.jsonl").read_text().splitlines()[:16]) + "\n")
    extra = ("--diag", "--checkpoint-every", "1", "--epochs", "3")
    ref = work / "ref"
    assert twinrun(*sft_args(model, ex, ref, 1, *extra)).returncode == 0
    survived, tried, details = 0, 0, []
    for k in range(kills):
        out = work / f"killed{k}"
        args = sft_args(model, ex, out, 1, *extra)
        if k % 2 == 0:  # mid-checkpoint-write, at a seeded step
            res = twinrun(*args, env={"TWINRUN_CRASH_AT": f"checkpoint-mid-write:{k // 2 + 1}"})
            how = f"mid-checkpoint-write:{k // 2 + 1}"
            killed = res.returncode == -signal.SIGKILL
        else:  # a seeded random moment
            delay = rng.uniform(1.5, 3.5)
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            proc = subprocess.Popen([sys.executable, "-m", "twinrun", *args], **quiet)  # type: ignore[call-overload]
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            how, killed = f"after {delay:.2f} s", not (out / "twinrun.json").exists()
        tried += 1
        res = twinrun(*args, "--resume") if killed else twinrun(*args, "--overwrite")
        started = out.is_dir() and any(out.iterdir())
        if killed and not started and res.returncode == 2 and "no record" in res.stderr:
            # killed while starting up, before its output existed: --resume rightly finds
            # nothing to continue, and the plain command is what the user reruns
            how += " (before its output existed)"
            res = twinrun(*args)
        same = res.returncode == 0 and all(
            (ref / name).read_bytes() == (out / name).read_bytes()
            for name in ("adapter_model.safetensors", "adapter_config.json", "diag.jsonl")
        )
        survived += same
        details.append({"kill": how, "killed": killed, "rerun_exit": res.returncode,
                        "bit_exact": same, "stderr": res.stderr.strip()[-300:]})  # fmt: skip
    return {"crashes_tried": tried, "crashes_survived": survived, "crashes": details}


def sweep_canaries(work: Path, model: Path) -> dict[str, Any]:
    from testkit.fake_trainer import fake
    from testkit.toy_runs import sft_args

    secrets = ["--env-arg", f"token={CANARY}", f"https://u:{CANARY}@h/x?token={CANARY}",
               f"--api-key={CANARY}"]  # fmt: skip
    url = f"https://user:{CANARY}@hub.example/x?api_key={CANARY}"
    runs = [
        twinrun("check", "--json", "--keep", str(work / "keep"), "--", *fake(), *secrets),
        twinrun("check", "--", *fake("fail"), *secrets),
    ]
    for flag in ("--examples", "--model", "--output"):
        args = sft_args(model, work / "none.jsonl", work / "out", 1)
        args[args.index(flag) + 1] = url
        runs.append(twinrun(*args))
    lines = [line for r in runs for line in (r.stdout + r.stderr).splitlines()]
    leaked_lines = [line for line in lines if CANARY in line]
    files = [p for p in work.rglob("*") if p.is_file() and not p.name.endswith(".log")]
    leaked_files = [str(p) for p in files if CANARY.encode() in p.read_bytes()]
    return {"lines_checked": len(lines), "files_checked": len(files),
            "canaries_leaked": len(leaked_lines) + len(leaked_files),
            "leaks": leaked_lines[:5] + leaked_files[:5]}  # fmt: skip


def sweep_reads(work: Path, model: Path) -> dict[str, Any]:
    from testkit.toy_runs import sft_args, text_args

    os.mkfifo(work / "fifo")
    (work / "dir").mkdir()
    (work / "empty.jsonl").write_text("")
    looping = work / "looping"
    shutil.copytree(model, looping)
    (looping / "chat_template.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    huge = work / "huge"
    shutil.copytree(model, huge)
    (huge / "chat_template.jinja").write_text("{{ 'x' * 3000000000 }}")
    examples = str(ROOT / "src/twinrun/examples/sft.jsonl")
    cases: dict[str, list[str]] = {}
    for kind in ("fifo", "/dev/zero", "dir"):
        path = kind if kind.startswith("/") else str(work / kind)
        cases[f"run {kind}"] = ["run", path]
        cases[f"explain {kind}"] = ["explain", path]
        cases[f"diff {kind}"] = ["diff", path, str(work / "empty.jsonl")]
        cases[f"--examples {kind}"] = sft_args(model, Path(path), work / "out", 1)
        cases[f"--corpus {kind}"] = text_args(model, [Path(path)], work / "out")
    for name, m in (("looping", looping), ("huge", huge)):
        cases[f"chat template {name}"] = sft_args(m, Path(examples), work / "out", 1)
    details, refused = [], 0
    for name, args in cases.items():
        t0 = time.perf_counter()
        try:
            res = subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
            lines = res.stderr.strip().splitlines()
            ok = res.returncode == 2 and len(lines) == 1 and "internal" not in lines[0]
            outcome = lines[-1][:200] if lines else f"exit {res.returncode}"
        except subprocess.TimeoutExpired:
            ok, outcome = False, "still running after 120 s"
        refused += ok
        details.append({"case": name, "refused": ok, "seconds": round(time.perf_counter() - t0, 1),
                        "line": outcome})  # fmt: skip
    return {"reads_tried": len(cases), "reads_refused": refused, "reads": details}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-parser", type=int, default=1500)
    ap.add_argument("--flips-per-file", type=int, default=4)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--overwrite-cases", type=int, default=8)
    ap.add_argument("--checkpoint-flips", type=int, default=6)
    ap.add_argument("--replay-copies", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small counts for every section")
    a = ap.parse_args()
    if a.quick:
        a.per_parser, a.flips_per_file, a.kills = 100, 1, 2
        a.overwrite_cases, a.checkpoint_flips, a.replay_copies = 4, 3, 1
    rng = random.Random(a.seed)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"seed": a.seed}
    result["inputs"] = sweep_inputs(a.per_parser, rng)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        from twinrun.model.toy import write_toy_checkpoint

        model = work / "model"
        write_toy_checkpoint(model, seed=0)
        (work / "flips").mkdir()
        init, replay_doc = make_capture(work / "flips", model)
        result["flips"] = sweep_flips(work / "flips", init, replay_doc, rng, a.flips_per_file)
        (work / "kills").mkdir()
        result["crashes"] = sweep_kills(work / "kills", model, rng, a.kills)
        (work / "reads").mkdir()
        result["reads"] = sweep_reads(work / "reads", model)
        (work / "canaries").mkdir()
        result["canaries"] = sweep_canaries(work / "canaries", model)
        for name in ("overwrite", "outputs", "flags", "checkpoints", "copies"):
            (work / name).mkdir()
        result["overwrite"] = rel.sweep_overwrite(work / "overwrite", model, rng,
                                                  a.overwrite_cases)  # fmt: skip
        result["outputs"] = rel.sweep_outputs(work / "outputs", model)
        result["flag_values"] = rel.sweep_flag_values(work / "flags", model)
        result["checkpoints"] = rel.sweep_checkpoints(work / "checkpoints", model, rng,
                                                      a.checkpoint_flips)  # fmt: skip
        result["replay_copies"] = rel.sweep_replay_copies(
            work / "copies", work / "flips" / "source", replay_doc, rng, a.replay_copies
        )
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    summary = {
        "inputs tried": result["inputs"]["inputs_tried"],
        "internal errors": result["inputs"]["internal_errors"],
        "flips refused": f"{result['flips']['flips_refused']}/{result['flips']['flips_tried']}",
        "crashes survived (bit-exact resume)":
            f"{result['crashes']['crashes_survived']}/{result['crashes']['crashes_tried']}",
        "hostile reads refused in one line":
            f"{result['reads']['reads_refused']}/{result['reads']['reads_tried']}",
        "canaries leaked": result["canaries"]["canaries_leaked"],
        "--overwrite of a foreign directory refused, nothing changed":
            f"{result['overwrite']['overwrites_refused_untouched']}/"
            f"{result['overwrite']['overwrites_tried']}",
        "bad outputs refused before the work":
            f"{result['outputs']['outputs_refused_before_work']}/"
            f"{result['outputs']['outputs_tried']}"
            + (f" ({result['outputs']['unwritable_skipped_as_root']} unwritable cases skipped: "
               "run as root)" if result["outputs"]["unwritable_skipped_as_root"] else ""),
        "flag-value canaries leaked":
            f"{result['flag_values']['flag_canaries_leaked']} of "
            f"{result['flag_values']['flag_cases_tried']} cases",
        "flag errors not one line (exit 2)": result["flag_values"]["flag_errors_not_one_line"],
        "flipped checkpoints refused / resumed bit-exactly / trained on":
            f"{result['checkpoints']['refused_one_line']} / "
            f"{result['checkpoints']['resumed_bit_exact']} / "
            f"{result['checkpoints']['trained_on_corrupt']} of "
            f"{result['checkpoints']['checkpoint_flips_tried']}",
        "copied replays refused by gate A":
            f"{result['replay_copies']['copies_refused_by_name']}/"
            f"{result['replay_copies']['copies_tried']} (fresh pair counted: "
            f"{result['replay_copies']['fresh_pair_counted']})",
    }  # fmt: skip
    result["summary"] = summary
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hostile_sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items())
    per = "\n".join(
        f"| {p} | {c['ok']} | {c['refused']} | {c['internal']} |"
        for p, c in result["inputs"]["by_parser"].items()
    )
    (RESULTS / "hostile_sweep.md").write_text(
        f"# Hostile sweep (seed {a.seed}, {result['wall_s']} s)\n\n"
        f"`python -m bench hostile_sweep --per-parser {a.per_parser} --flips-per-file "
        f"{a.flips_per_file} --kills {a.kills} --overwrite-cases {a.overwrite_cases} "
        f"--checkpoint-flips {a.checkpoint_flips} --replay-copies {a.replay_copies} "
        f"--seed {a.seed}`" + (" (`--quick`)" if a.quick else "") + "\n\n"
        f"| count | value |\n|---|---|\n{rows}\n\n"
        f"Files a replay reads, each flipped at {a.flips_per_file} seeded offsets: "
        f"{', '.join(result['flips']['files'])}.\n\n"
        f"| parser | parsed | refused (one line) | internal error |\n|---|---|---|---|\n{per}\n"
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
