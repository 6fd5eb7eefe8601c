"""Fresh replays for `twinrun evidence --repeat N CONFIG`: each one is its own
`python -m twinrun run CONFIG --output DIR` process (timings of a warm process would flatter
every replay after the first), into `<[logging] dir>.repeat-<i>`, the first free indices. At most
MAX_REPEAT of them: each is a whole process, and the timing spread needs a few, not thousands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from twinrun.config.toml import load_toml
from twinrun.core.portable import user_environment
from twinrun.replay.evidence import EvidenceInputError

MAX_REPEAT = 100


def repeat_replays(config: Path, n: int) -> list[Path]:
    if n < 1:
        raise EvidenceInputError(f"--repeat needs N >= 1, got {n}")
    if n > MAX_REPEAT:  # before the config is read or any replay runs
        shown = str(n) if n < 10**12 else f"{str(n)[:6]}... ({len(str(n))} digits)"
        raise EvidenceInputError(
            f"--repeat {shown} is more than the cap of {MAX_REPEAT} replays",
            f"give N <= {MAX_REPEAT} (each replay is its own process)",
        )
    run = load_toml(config)
    if run.trainer != "optimizer_replay":
        raise EvidenceInputError(f"--repeat {config}: not a replay config ({run.trainer})")
    base = Path(run.pins().output)
    out: list[Path] = []
    i = 1
    while len(out) < n:
        target = base.with_name(f"{base.name}.repeat-{i}")
        i += 1
        if target.exists():
            continue
        cmd = [
            sys.executable,
            "-m",
            "twinrun",
            "run",
            str(config),
            "--output",
            str(target),
            "--quiet",
        ]
        # the user's environment: a native replay runs the kernels its source ran
        proc = subprocess.run(cmd, capture_output=True, text=True, env=user_environment())
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise EvidenceInputError(f"repeated replay {target} failed: {tail}")
        out.append(target)
    return out
