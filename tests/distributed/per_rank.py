"""Run twinrun with the arguments of this process's rank: a JSON file holds one argument list
per rank (what one torchrun command per node, typed differently on one node, amounts to)."""

from __future__ import annotations

import json
import os
import sys

from twinrun.cli.main import main

if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        per_rank = json.load(fh)
    sys.argv = ["twinrun", *per_rank[int(os.environ["RANK"])]]
    main()
