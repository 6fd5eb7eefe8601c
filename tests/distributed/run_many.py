"""Run each twinrun command listed in a JSON file (a list of argument lists) in this process,
in order; stop at the first that fails. Started by torchrun: every command of the list runs in
one process group, like `torchrun -m twinrun` does once per command."""

from __future__ import annotations

import gc
import json
import sys

from twinrun.cli.main import run_cli
from twinrun.train.parallel.distributed import teardown


def main(spec: str) -> int:
    with open(spec) as fh:
        runs = json.load(fh)
    for args in runs:
        code = run_cli(args)
        if code != 0:
            return code
    teardown()
    gc.freeze()  # as twinrun's main does: no last collections over torch's objects at exit
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
