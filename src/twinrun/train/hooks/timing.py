"""Step timings and peak memory, in the same fields for a replay and for the source step it
replays: the step's collect, forward, backward and optimizer seconds (as the loop measured them;
a replay collects nothing: its batch is the captured one), the wall time of the update
(`local_train_wall_s`) and the peak memory (`peak_memory_bytes`, and which peak it is in
`peak_memory_kind`)."""

from __future__ import annotations

import resource
from typing import Any

from twinrun.train.step.loop import Hook, Phase, StepView


def peak_memory(device: str) -> tuple[int, str]:
    """Peak memory of this process: CUDA's allocator peak, or the process's peak resident set
    (VmHWM: unlike ru_maxrss it is not inherited from the process that started us)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "process_peak_rss"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"


def step_timing_fields(view: StepView, row: dict[str, Any], device: str) -> dict[str, Any]:
    """The timing and memory fields of a step's metrics row."""
    peak, kind = peak_memory(device)
    return {
        **view.timings,
        "local_train_wall_s": row["wall_s"],
        "peak_memory_bytes": peak,
        "peak_memory_kind": kind,
    }


class TimingHook(Hook):
    points = {"after_step": Phase.RECORD}

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        row.update(step_timing_fields(view, row, self.device))
