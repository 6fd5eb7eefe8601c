"""The hostile sweep's reliability sections (issue 26): what `--overwrite`, the output checks,
the flag errors, resume and the evidence gates must withstand. Each is seeded and bounded; each
returns counts and the cases that did not hold. `bench/hostile_sweep.py` runs them.

6. overwrite: someone's directory — seeded mixes of twinrun's own names and foreign entries (a
   source tree, notes, a file in `checkpoints/`, a symbolic link named like a twinrun folder, a
   folder where twinrun writes a file) — given to `tune sft --overwrite`: one line, exit 2, every
   byte (inside, and where a link points) unchanged;
7. outputs: every command that writes files handed an output that is a symbolic link (to a
   finished run), dangling, under a regular file, unwritable (not as root: root writes anyway) or
   foreign. The model and examples are traps (an unreadable config.json, a malformed examples
   file): a refusal that names the output, not the trap, came before the work;
8. flag values: a canary given to every typed flag of every command (integers, floats, choices,
   paths, tuples, flags that take no value, unknown flags with `=value`, extra arguments,
   unknown commands), in-process: exit 2, one line, the canary on no line;
9. checkpoints: a byte flipped at a seeded offset of a seeded file of the last complete
   checkpoint of a killed run, then `--resume`: refused in one line ("is corrupt"), or resumed
   to exactly an uninterrupted run's bytes — never trained on the flipped bytes;
10. replay copies: two fresh replays of a capture, and one copied under a new name: gate A
   counts the fresh pair and refuses the copy by name.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

CANARY = "sk-live-5e1d0c"  # a short plain word: the kind the old choice errors repeated


def twinrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                          text=True, env=os.environ | (env or {}), timeout=300)  # fmt: skip


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root`, links not followed: a file's bytes, a link's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else (
            p.read_bytes() if p.is_file() else "dir")  # fmt: skip
    return out


def one_line(res: subprocess.CompletedProcess[str]) -> str | None:
    """The single error line of a refusal (exit 2), or None."""
    lines = (res.stdout + res.stderr).strip().splitlines()
    if res.returncode != 2 or len(lines) != 1 or "internal error" in lines[0]:
        return None
    return lines[0]


def shipped_rows(path: Path, n: int) -> Path:
    from twinrun.data.examples import shipped_examples

    path.write_text("\n".join(shipped_examples("sft.jsonl").read_text().splitlines()[:n]) + "\n")
    return path


# --- 6. overwrite only what twinrun wrote ------------------------------------------------------


def _foreign(out: Path, outside: Path) -> dict[str, Any]:
    def file(rel: str, data: str) -> Any:
        def make() -> None:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(data)

        return make

    def folder_for_file() -> None:  # a folder where twinrun writes metrics.jsonl
        (out / "metrics.jsonl").unlink(missing_ok=True)
        (out / "metrics.jsonl").mkdir()
        (out / "metrics.jsonl" / "mine.txt").write_text("mine\n")

    def link() -> None:  # a twinrun folder name, but a link out of the directory
        shutil.rmtree(out / "final", ignore_errors=True)
        (out / "final").symlink_to(outside)

    return {
        "notes.txt": file("notes.txt", "my notes\n"),
        "src/train.py": file("src/train.py", "print('my code')\n"),
        "checkpoints/mine.bin": file("checkpoints/mine.bin", "weights I keep\n"),
        "checkpoints/step-000001/README": file("checkpoints/step-000001/README", "mine\n"),
        ".git/HEAD": file(".git/HEAD", "ref: refs/heads/main\n"),
        "metrics.jsonl/ (a folder)": folder_for_file,
        "final -> outside": link,
    }


def sweep_overwrite(work: Path, model: Path, rng: random.Random, cases: int) -> dict[str, Any]:
    from testkit.toy_runs import sft_args

    ex = shipped_rows(work / "ex.jsonl", 8)
    ref = work / "ref"  # a real run directory, with checkpoints and diag
    res = twinrun(*sft_args(model, ex, ref, 1, "--diag", "--checkpoint-every", "1"))
    assert res.returncode == 0, res.stderr
    outside = work / "outside"
    outside.mkdir()
    (outside / "precious.safetensors").write_bytes(b"weights kept elsewhere")
    held, details = 0, []
    for k in range(cases):
        out = work / f"case{k}"
        if k % 2 == 0:
            shutil.copytree(ref, out, symlinks=True)  # a finished run, then someone's files
        else:  # a directory that only looks like a run: twinrun names, no marker
            out.mkdir()
            (out / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
            (out / "diag.jsonl").write_text("{}\n")
        makers = _foreign(out, outside)
        added = rng.sample(sorted(makers), rng.randrange(1, 4))
        for name in added:
            makers[name]()
        before, kept = snapshot(out), snapshot(outside)
        res = twinrun(*sft_args(model, ex, out, 1, "--overwrite"))
        line = one_line(res)
        ok = bool(line and "--overwrite refused" in line) and snapshot(out) == before
        ok = ok and snapshot(outside) == kept
        held += ok
        details.append({"base": "finished run" if k % 2 == 0 else "no marker", "added": added,
                        "held": ok, "line": (line or res.stderr.strip())[-200:]})  # fmt: skip
    return {"overwrites_tried": cases, "overwrites_refused_untouched": held, "cases": details}


# --- 7. outputs checked before the work --------------------------------------------------------

OUTPUT_CASES = ("symlink", "dangling", "under-file", "unwritable", "foreign")
EXPECTED = {"symlink": "is a symbolic link (to ", "dangling": "is a symbolic link (to ",
            "under-file": "which is a file and not a directory",
            "unwritable": "is not writable by this process"}  # fmt: skip
FOREIGN = ("which twinrun did not write", "is not empty", "is a directory, not a file",
           "which the toy checkpoint does not")  # fmt: skip


def _writers(trap: Path, trap_ex: Path, toml: Path, finished: Path) -> dict[str, Any]:
    """command -> (output name, argv for an output path): every command that writes files."""
    from testkit.toy_runs import run_args

    common = ["--model", str(trap), "--chat-template", "on", "--precision", "f32",
              "--threads", "1", "--batch-size", "2", "--examples", str(trap_ex)]  # fmt: skip

    def tune(objective: str, o: str) -> list[str]:
        env = ["--env", "arithmetic"] if objective == "grpo" else []  # a built-in: no import
        return run_args(objective, trap, trap_ex, Path(o), *env, "--overwrite")

    sft = tune("sft", "{out}")[2:]
    return {
        "tune sft": ("out", lambda o: tune("sft", o)),
        "tune grpo": ("out", lambda o: tune("grpo", o)),
        "run": ("out", lambda o: ["run", str(toml), "--output", o]),
        "tune evaluate": ("report.json", lambda o: ["tune", "evaluate", *common, "--output", o]),
        "extract": (
            "h.safetensors",
            lambda o: ["extract", *common, "--layer", "1", "--pool", "last", "--output", o],
        ),  # fmt: skip
        "init-adapter": (
            "out",
            lambda o: [
                "init-adapter",
                o,
                "--model",
                str(trap),
                "--seed",
                "1",
                "--lora-rank",
                "4",
                "--lora-alpha",
                "8",
            ],
        ),
        "toy-model": ("out", lambda o: ["toy-model", o, "--seed", "3", "--overwrite"]),
        "check --keep": (
            "out",
            lambda o: [
                "check",
                "--keep",
                o,
                "--",
                "twinrun",
                "tune",
                "sft",
                *sft,
                "--seed",
                "{seed}",
            ],
        ),
        "reproduce": (
            "out",
            lambda o: ["reproduce", str(finished), "--output", o, "--overwrite"],
        ),  # fmt: skip
    }


def _make_output(case: str, root: Path, name: str, finished: Path) -> Path:
    if case == "symlink":
        (root / name).symlink_to(finished)
    elif case == "dangling":
        (root / name).symlink_to(root / "nowhere" / "deep")
    elif case == "under-file":
        (root / "a-file").write_text("a regular file\n")
        return root / "a-file" / name
    elif case == "unwritable":
        (root / "locked").mkdir()
        (root / "locked").chmod(0o500)
        return root / "locked" / name
    else:
        (root / name).mkdir()
        (root / name / "notes.txt").write_text("mine\n")
        (root / name / "metrics.jsonl").write_text('{"step": 0}\n')
    return root / name


def sweep_outputs(work: Path, model: Path) -> dict[str, Any]:
    from testkit.captures import write_toml
    from testkit.toy_runs import sft_args

    finished = work / "finished"
    ex = shipped_rows(work / "ex.jsonl", 8)
    res = twinrun(*sft_args(model, ex, finished, 1))
    assert res.returncode == 0, res.stderr
    trap = work / "trap-model"  # read first, it would say so: the refusal came too late
    trap.mkdir()
    (trap / "config.json").write_text("{ a trap: loading this model is the work }")
    trap_ex = work / "trap.jsonl"
    trap_ex.write_text("a trap: reading these examples is the work\n")
    toml = write_toml(work / "run.toml", {
        "training": {"trainer": "sft", "seed": 1, "epochs": 1, "batch_size": 2,
                     "accumulation": 1, "learning_rate": 0.01, "warmup_steps": 0,
                     "lr_schedule": "constant", "precision": "f32"},
        "model": {"path": str(trap), "chat_template": "on", "lora_rank": 4, "lora_alpha": 8},
        "data": {"examples": str(trap_ex)},
        "backend": {"devices": "cpu", "options": {"threads": 1}},
        "logging": {"dir": str(work / "unused")},
    })  # fmt: skip
    root_user = os.geteuid() == 0
    tried = refused = skipped = 0
    details = []
    for command, (name, argv) in _writers(trap, trap_ex, toml, finished).items():
        for case in OUTPUT_CASES:
            if case == "unwritable" and root_user:
                skipped += 1  # root writes into a 0o500 directory: nothing to refuse
                continue
            if case == "foreign" and command == "check --keep":
                continue  # --keep adds its runs beside what a directory holds, by design
            root = work / f"{command.replace(' ', '_')}-{case}"
            root.mkdir()
            out = _make_output(case, root, name, finished)
            before, kept = snapshot(root), snapshot(finished)
            res = twinrun(*argv(str(out)))
            if case == "unwritable":
                (root / "locked").chmod(0o700)
            line = one_line(res) or ""
            says = [EXPECTED[case]] if case in EXPECTED else list(FOREIGN)
            ok = any(s in line for s in says) and "trap" not in line
            ok = ok and snapshot(root) == before and snapshot(finished) == kept
            tried += 1
            refused += ok
            details.append({"command": command, "case": case, "refused_first": ok,
                            "line": (line or res.stdout + res.stderr).strip()[-200:]})  # fmt: skip
    return {"outputs_tried": tried, "outputs_refused_before_work": refused,
            "unwritable_skipped_as_root": skipped, "cases": details}  # fmt: skip


# --- 8. no value echoed in a flag error ---------------------------------------------------------


def _flag_cases(work: Path) -> list[list[str]]:
    """A canary for every typed flag of every command, and the value-less kinds of mistake."""
    from twinrun.cli.main import COMMANDS, cli

    a_file, a_dir = work / CANARY, work / f"{CANARY}.d"
    a_file.write_text("a file, where a directory is needed\n")
    a_dir.mkdir()
    ctx = click.Context(cli)
    commands: list[tuple[list[str], click.Command]] = []
    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        if isinstance(cmd, click.Group):
            commands += [([name, sub], cmd.get_command(ctx, sub)) for sub in cmd.list_commands(ctx)]
        else:
            commands.append(([name], cmd))
    cases: list[list[str]] = []
    for words, cmd in commands:
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.name == "help":
                continue
            flag = p.opts[-1]
            if p.is_flag:
                cases.append([*words, f"{flag}={CANARY}"])
            elif isinstance(p.type, click.Path):  # a file where a directory goes, or back
                cases.append([*words, flag, str(a_dir if p.type.file_okay else a_file)])
            elif p.type not in (click.STRING, click.UNPROCESSED) and p.nargs == 1:
                cases += [[*words, flag, CANARY], [*words, f"{flag}={CANARY}"]]
        cases.append([*words, f"--tokn={CANARY}"])
        if not any(isinstance(p, click.Argument) for p in cmd.params):
            cases.append([*words, CANARY])  # an extra argument
    cases += [[CANARY], ["tune", CANARY], ["evidence", "src", "--repeat", CANARY, "c.toml"]]
    return cases


def sweep_flag_values(work: Path, model: Path) -> dict[str, Any]:
    from testkit.toy_runs import sft_args
    from twinrun.cli.main import run_cli
    from twinrun.config.run import SETTINGS

    cases = _flag_cases(work)
    full = sft_args(work / "no-model", work / "no.jsonl", work / "no-out", 1)
    for s in SETTINGS.values():  # twinrun's own choices, checked once every flag is given
        if s.flag and s.choices and "sft" in s.objectives:
            cases.append([*full, s.flag.split("/")[0], CANARY])
    leaked, not_one_line, details = 0, 0, []
    for argv in cases:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = run_cli(argv)
        text = out.getvalue() + err.getvalue()
        lines = text.strip().splitlines()
        leak = CANARY in text
        bad = rc != 2 or len(lines) != 1 or "internal error" in text
        leaked += leak
        not_one_line += bad
        if leak or bad:
            details.append({"argv": argv, "exit": rc, "lines": lines[:3]})
    return {"flag_cases_tried": len(cases), "flag_canaries_leaked": leaked,
            "flag_errors_not_one_line": not_one_line, "failures": details[:20]}  # fmt: skip


# --- 9. a checkpoint flipped, then resumed ------------------------------------------------------


def sweep_checkpoints(work: Path, model: Path, rng: random.Random, flips: int) -> dict[str, Any]:
    from testkit.toy_runs import sft_args

    ex = shipped_rows(work / "ex.jsonl", 16)
    extra = ("--diag", "--checkpoint-every", "1")
    ref = work / "ref"
    res = twinrun(*sft_args(model, ex, ref, 1, *extra))
    assert res.returncode == 0, res.stderr
    killed = work / "killed"  # SIGKILLed writing checkpoint 3: step-1 and step-2 complete
    res = twinrun(*sft_args(model, ex, killed, 1, *extra),
                  env={"TWINRUN_CRASH_AT": "checkpoint-mid-write:3"})  # fmt: skip
    assert res.returncode == -signal.SIGKILL, res.stderr
    last = killed / "checkpoints" / "step-000002"
    files = sorted(p.name for p in last.iterdir() if p.is_file())
    refused = fell_back = trained_on_it = 0
    details = []
    for k in range(flips):
        run = work / f"flip{k}"
        shutil.copytree(killed, run)
        name = rng.choice(files)
        target = run / "checkpoints" / "step-000002" / name
        data = bytearray(target.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        res = twinrun(*sft_args(model, ex, run, 1, *extra, "--resume"))
        line = one_line(res)
        if line and "is corrupt" in line:
            refused += 1
            how = "refused"
        elif res.returncode == 0 and all(
            (ref / f).read_bytes() == (run / f).read_bytes()
            for f in ("adapter_model.safetensors", "diag.jsonl")
        ):
            fell_back += 1
            how = "resumed bit-exactly"
        else:
            trained_on_it += 1
            how = f"exit {res.returncode}"
        details.append({"file": name, "offset": i, "outcome": how,
                        "line": (line or res.stderr.strip())[-200:]})  # fmt: skip
    return {"checkpoint_flips_tried": flips, "refused_one_line": refused,
            "resumed_bit_exact": fell_back, "trained_on_corrupt": trained_on_it,
            "flips": details}  # fmt: skip


# --- 10. a copied replay is not a fresh one -------------------------------------------------------


def sweep_replay_copies(
    work: Path, source: Path, doc: dict[str, Any], rng: random.Random, copies: int
) -> dict[str, Any]:
    """`doc`: a replay config of the capture in `source` (from the flips section)."""
    import copy as copying

    from testkit.captures import write_toml

    fresh = []
    for name in ("fresh-a", "fresh-b"):
        d = copying.deepcopy(doc)
        d["logging"]["dir"] = str(work / name)
        res = twinrun("run", str(write_toml(work / f"{name}.toml", d)), "--quiet")
        assert res.returncode == 0, res.stderr
        fresh.append(str(work / name))
    pair = twinrun("evidence", str(source), *fresh, "--require", "A", "--json")
    fresh_ok = _repeated_ok(pair)
    refused, details = 0, []
    for k in range(copies):
        original = rng.choice(fresh)
        copied = work / f"copy-{k}-{rng.randrange(1 << 16):04x}"
        shutil.copytree(original, copied)
        res = twinrun("evidence", str(source), original, str(copied), "--require", "A", "--json")
        detail = _repeated_detail(res)
        ok = res.returncode == 1 and f"{copied} is a copy of" in detail
        refused += ok
        details.append({"copy": copied.name, "of": Path(original).name, "refused": ok,
                        "detail": detail[:200]})  # fmt: skip
    return {"fresh_pair_counted": fresh_ok, "copies_tried": copies,
            "copies_refused_by_name": refused, "copies": details}  # fmt: skip


def _criterion(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        report = json.loads(res.stdout)
    except ValueError:
        return {}
    return next((c for c in report["gates"]["A"]["criteria"]
                 if c["name"] == "repeated fresh replays"), {})  # fmt: skip


def _repeated_ok(res: subprocess.CompletedProcess[str]) -> bool:
    return bool(_criterion(res).get("ok"))


def _repeated_detail(res: subprocess.CompletedProcess[str]) -> str:
    return str(_criterion(res).get("detail", res.stdout + res.stderr))
