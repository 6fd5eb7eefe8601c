"""Under torchrun: join the process group as a run does, import what transformers imports while
it loads a model, leave the group, and write the names of this process's OS threads before and
after to FOLDER/rank-R.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from twinrun.train import distributed


def thread_names() -> list[str]:
    here = Path(f"/proc/{os.getpid()}/task")
    return [(task / "comm").read_text().strip() for task in sorted(here.iterdir())]


if __name__ == "__main__":
    distributed.setup("cpu")
    before = thread_names()
    import transformers.integrations.accelerate  # noqa: F401  (imports torch.distributed.nn)

    distributed.teardown()
    report = {"before": before, "after": thread_names()}
    Path(sys.argv[1], f"rank-{os.environ['RANK']}.json").write_text(json.dumps(report))
