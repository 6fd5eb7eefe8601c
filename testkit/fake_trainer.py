"""A stand-in trainer for `twinrun check`: a few lines of Python that write metrics rows without
torch, so a check's runs take milliseconds."""

from __future__ import annotations

import sys

# A stand-in trainer: `python -c FAKE SEED OUT [MODE]` writes 3 metrics rows; the loss depends on
# the seed unless MODE is "seedless"; "nothing" writes no metrics; "fail" exits 3 with stderr.
# It writes OUT/env.json: the ATEN_CPU_CAPABILITY it was started with (None: unset).
FAKE = """
import json, os, sys, time
seed, out = int(sys.argv[1]), sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else ""
if mode == "fail":
    print("loading...")
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: planted failure", file=sys.stderr)
    sys.exit(3)
os.makedirs(out)
with open(os.path.join(out, "env.json"), "w") as f:  # what the child was started with
    json.dump({"ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY")}, f)
if mode != "nothing":
    k = 0 if mode == "seedless" else seed
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for s in range(3):
            row = {"step": s, "loss": 2.0 / (s + 1) + 0.25 * k, "tokens": 10, "wall_s": time.time()}
            f.write(json.dumps(row) + "\\n")
"""


def fake(*mode: str) -> list[str]:
    return [sys.executable, "-c", FAKE, "{seed}", "{out}", *mode]
