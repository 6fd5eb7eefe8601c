"""Under torchrun: join the process group as a run does, import what transformers imports while
it loads a model, leave the group, and write the names of this process's OS threads before and
after to FOLDER/rank-R.json. With `--sharded`, a module is first sharded with FSDP2 (as
`--shard-base` shards a base), trained one step and dropped, before the group is left."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from twinrun.train.parallel import distributed


def thread_names() -> list[str]:
    here = Path(f"/proc/{os.getpid()}/task")
    return [(task / "comm").read_text().strip() for task in sorted(here.iterdir())]


def sharded_step(world: int) -> None:
    """One forward and backward of a two-layer module sharded as `--shard-base` shards a base;
    the module and its mesh are then dropped."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.ones(2, 4)).sum().backward()


if __name__ == "__main__":
    distributed.setup("cpu")
    before = thread_names()
    import transformers.integrations.accelerate  # noqa: F401  (imports torch.distributed.nn)

    if "--sharded" in sys.argv:
        sharded_step(int(os.environ["WORLD_SIZE"]))
    distributed.teardown()
    report = {"before": before, "after": thread_names()}
    Path(sys.argv[1], f"rank-{os.environ['RANK']}.json").write_text(json.dumps(report))
