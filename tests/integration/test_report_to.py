"""`--report-to tensorboard|wandb|mlflow`: without the package a run stops in one line before
anything is written; with it (a fake module recording every call) the tracker gets exactly the
numeric fields of metrics.jsonl's rows at their steps, a config that is the sidecar's redacted
`train` section, and the adapter bytes are those of the same run without it."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from testkit.toy_runs import run_args, sha256_of, write_examples
from twinrun.cli.main import run_cli
from twinrun.config.run import check_report_to
from twinrun.core.errors import ConfigError
from twinrun.train.hooks.report import flat_params, numeric_fields

CANARY = "sk-CANARY-report-to-7f3a"  # an environment secret no tracker may see

MISSING = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
}


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_examples(tmp_path_factory.mktemp("data"))["sft"]


@pytest.fixture(scope="module")
def plain_adapter(
    toy_model_dir: Path, examples: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    out = tmp_path_factory.mktemp("plain") / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out)) == 0
    return sha256_of(out / "adapter_model.safetensors")


def only_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("backend", sorted(MISSING))
def test_an_absent_package_is_one_line_and_nothing_written(
    backend: str,
    toy_model_dir: Path,
    examples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in MISSING[backend]:
        monkeypatch.setitem(sys.modules, module, None)  # blocks the import, installed or not
    out = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out, "--report-to", backend)) == 2
    package = MISSING[backend][-1]
    assert only_line(capsys) == (
        f"twinrun: error: --report-to {backend} needs the {package} package, which is not "
        f"installed — pip install {package} (or leave --report-to out)"
    )
    assert not out.exists()


def test_an_unknown_backend_lists_the_choices(
    toy_model_dir: Path, examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out, "--report-to", "comet")) == 2
    assert only_line(capsys) == (
        "twinrun: error: --report-to: unknown backend 'comet' — choose from tensorboard, wandb, "
        "mlflow (comma-separated or repeated)"
    )
    assert not out.exists()


def test_names_split_on_commas_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert check_report_to(["wandb, mlflow", "wandb"]) == ["wandb", "mlflow"]
    assert check_report_to([]) == []
    with pytest.raises(ConfigError, match=r"^logging.report_to: unknown backend$"):
        check_report_to(["https://user:secret@host"], "logging.report_to")


class Calls:
    """Every call the fake trackers receive, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def recorder(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args, kwargs))

        return record

    def named(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(a, k) for n, a, k in self.calls if n == name]


def fake_trackers(calls: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    class SummaryWriter:
        def __init__(self, **kwargs: Any) -> None:
            calls.recorder("tb.SummaryWriter")(**kwargs)
            self.add_scalar = calls.recorder("tb.add_scalar")
            self.flush = calls.recorder("tb.flush")
            self.close = calls.recorder("tb.close")

    tensorboard = types.ModuleType("torch.utils.tensorboard")
    tensorboard.SummaryWriter = SummaryWriter  # type: ignore[attr-defined]
    wandb = types.ModuleType("wandb")
    mlflow = types.ModuleType("mlflow")
    for module, names in ((wandb, ("init", "log", "finish")),
                          (mlflow, ("set_tracking_uri", "start_run", "log_params", "log_metrics",
                                    "end_run"))):  # fmt: skip
        for name in names:
            setattr(module, name, calls.recorder(f"{module.__name__}.{name}"))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", tensorboard)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)


def test_each_tracker_logs_the_metrics_rows_and_no_byte_changes(
    toy_model_dir: Path,
    examples: Path,
    plain_adapter: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls()
    fake_trackers(calls, monkeypatch)
    monkeypatch.setenv("TWINRUN_TEST_API_KEY", CANARY)
    out = tmp_path / "run"
    extra = ["--report-to", "tensorboard,wandb", "--report-to", "mlflow"]
    assert run_cli(run_args("sft", toy_model_dir, examples, out, *extra)) == 0

    assert sha256_of(out / "adapter_model.safetensors") == plain_adapter
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    expected = {r["step"]: numeric_fields(r) for r in rows}
    assert all("loss" in f and "step" not in f for f in expected.values())
    train = json.loads((out / "twinrun.json").read_text())["train"]

    # tensorboard: one scalar per field and step, flushed and closed at the end
    assert calls.named("tb.SummaryWriter") == [((), {"log_dir": str(out / "tensorboard")})]
    scalars: dict[int, dict[str, Any]] = {}
    for (tag, value, step), _ in calls.named("tb.add_scalar"):
        assert tag.startswith("train/")
        scalars.setdefault(step, {})[tag.removeprefix("train/")] = value
    assert scalars == expected
    assert calls.named("tb.close") == [((), {})] and calls.named("tb.flush")

    # wandb: offline, the sidecar's train section as config, one log per step, finished
    [(args, init)] = calls.named("wandb.init")
    assert args == () and init.pop("config") == train
    assert init == {"mode": "offline", "dir": str(out), "project": "twinrun", "name": out.name}
    assert {k["step"]: a[0] for a, k in calls.named("wandb.log")} == expected
    assert len(calls.named("wandb.finish")) == 1

    # mlflow: a local file store, the train section flattened to strings, metrics per step
    assert calls.named("mlflow.set_tracking_uri") == [(((out / "mlruns").resolve().as_uri(),), {})]
    assert calls.named("mlflow.start_run") == [((), {"run_name": out.name})]
    [((params,), _)] = calls.named("mlflow.log_params")
    assert params == flat_params(train) and all(isinstance(v, str) for v in params.values())
    assert {k["step"]: a[0] for a, k in calls.named("mlflow.log_metrics")} == expected
    assert len(calls.named("mlflow.end_run")) == 1

    # never a secret: no value of the environment in what the trackers were given
    given = json.dumps([init, train, params])
    assert CANARY not in given
    words = {v for v in train.values() if isinstance(v, str)}  # cosine, f32, ...
    mode = "TWINRUN_CPU_KERNELS"  # the suite's default mode: recorded on purpose, no secret
    assert not words & {v for k, v in os.environ.items() if len(v) >= 3 and k != mode}
    assert str(out) not in json.dumps(train)  # nor the command line's paths


@pytest.mark.parametrize("backend", sorted(MISSING))
def test_one_backend_alone_calls_only_its_tracker(
    backend: str,
    toy_model_dir: Path,
    examples: Path,
    plain_adapter: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls()
    fake_trackers(calls, monkeypatch)
    out = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out, "--report-to", backend)) == 0
    assert sha256_of(out / "adapter_model.safetensors") == plain_adapter
    prefix = {"tensorboard": "tb", "wandb": "wandb", "mlflow": "mlflow"}[backend]
    assert calls.calls and {name.split(".")[0] for name, _, _ in calls.calls} == {prefix}
