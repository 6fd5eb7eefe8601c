"""Step traces (twinrun.diag.trace): per-module checksums in execution order, their comparison,
the advice for where two traces part, and `compare`'s use of them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from twinrun.core.errors import DataError
from twinrun.diag.advice import trace_advice
from twinrun.diag.compare import compare
from twinrun.diag.recorder import DiagRecorder
from twinrun.diag.trace import (
    ROOT_NAME,
    TRACE_FORMAT,
    StepTrace,
    TraceDivergence,
    compare_traces,
    read_trace,
)
from twinrun.model.build import CausalLM, load_causal_lm
from twinrun.model.lora import apply_lora

IDS = torch.tensor([[5, 17, 99, 3, 42, 7], [8, 1, 250, 66, 0, 2]])


@pytest.fixture(autouse=True)
def one_thread() -> object:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def lora_model(toy_model_dir: Path) -> CausalLM:
    model = load_causal_lm(toy_model_dir)
    apply_lora(model, rank=4, alpha=8, seed=3)
    with torch.no_grad():  # nonzero B, so every LoRA output (and A's gradient) is nonzero
        for name, p in model.named_parameters():
            if name.endswith("lora_B.weight"):
                p.copy_(torch.linspace(-0.01, 0.01, p.numel()).reshape(p.shape))
    return model


def traced_step(
    model: CausalLM, path: Path, step: int = 0, forwards: int = 2, per_row: bool = False
) -> list:
    """One optimizer step's forwards/backwards (accumulation) inside a StepTrace."""
    with StepTrace(model, path, step):
        for i in range(forwards):
            ids = IDS.roll(i, dims=1)
            loss_rows = model(ids).log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).sum((1, 2))
            if per_row:
                for r in reversed(range(len(loss_rows))):
                    (-loss_rows[r]).backward(retain_graph=True)
            else:
                (-loss_rows.sum()).backward()
    entries = read_trace(path / "trace.jsonl" if path.is_dir() else path, step)
    assert entries is not None
    return entries


def test_identical_steps_give_identical_traces(toy_model_dir: Path, tmp_path: Path) -> None:
    a = traced_step(lora_model(toy_model_dir), tmp_path / "a" / "trace.jsonl")
    b = traced_step(lora_model(toy_model_dir), tmp_path / "b" / "trace.jsonl")
    assert a == b
    assert (tmp_path / "a" / "trace.jsonl").read_bytes() == (
        tmp_path / "b" / "trace.jsonl"
    ).read_bytes()
    assert compare_traces(a, b, step=0, exact=True) is None
    kinds = {e[0] for e in a}
    assert kinds == {"forward", "backward", "param_grad", "final_grad"}
    names = {e[1] for e in a}
    for expected in (
        "model.embed_tokens",
        "model.layers.0.input_layernorm",
        "model.layers.0.self_attn",
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.q_proj.base_layer",
        "model.layers.0.self_attn.q_proj.lora_A",
        "model.layers.0.self_attn.q_proj.lora_B",
        "model.layers.0.mlp",
        "model.layers.0.mlp.down_proj",
        "model.layers.3",
        "model.norm",
        "lm_head",
        ROOT_NAME,
        "model.layers.1.self_attn.v_proj.lora_A.weight",
    ):
        assert expected in names, expected


def test_entries_follow_execution_order(toy_model_dir: Path, tmp_path: Path) -> None:
    entries = traced_step(lora_model(toy_model_dir), tmp_path / "t.jsonl", forwards=2)
    fwd = [(n, c) for k, n, c, _ in entries if k == "forward"]
    assert fwd[0] == ("model.embed_tokens", 0)
    # children return before their parents; the second forward has call index 1
    q = fwd.index(("model.layers.0.self_attn.q_proj", 0))
    assert fwd.index(("model.layers.0.self_attn.q_proj.base_layer", 0)) < q
    assert fwd.index(("model.layers.0.self_attn.q_proj.lora_B", 0)) < q
    assert fwd.index(("model.layers.0", 0)) > fwd.index(("model.layers.0.mlp", 0))
    assert ("model.embed_tokens", 1) in fwd and (ROOT_NAME, 1) in fwd
    kinds = [k for k, *_ in entries]
    # forward 0, backward 0, forward 1, backward 1, then the final gradients
    first_back = kinds.index("backward")
    assert set(kinds[:first_back]) == {"forward"}
    assert entries[first_back][1] == "lm_head"  # the first gradient is the logits'
    assert kinds[-1] == "final_grad" and "param_grad" in kinds[first_back:]
    finals = [e for e in entries if e[0] == "final_grad"]
    assert len(finals) == 4 * 4 * 2  # 4 layers x q/k/v/o x (A, B)
    assert all(v is not None and v > 0 for *_, v in finals)


def test_perturbed_lora_weight_is_the_first_differing_module(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    a = traced_step(lora_model(toy_model_dir), tmp_path / "a.jsonl")
    model = lora_model(toy_model_dir)
    with torch.no_grad():
        model.get_submodule("model.layers.2.self_attn.v_proj").lora_B.weight[0, 0] += 1e-3
    b = traced_step(model, tmp_path / "b.jsonl")
    div = compare_traces(a, b, step=0)
    assert div is not None and not div.structural
    assert (div.kind, div.direction) == ("forward", "forward")
    assert div.module == "model.layers.2.self_attn.v_proj.lora_B" and div.call == 0
    assert div.rel > 1e-5
    # every entry before it agrees exactly (layers 0-1 and layer 2's q/k projections)
    assert a[: div.position] == b[: div.position]
    assert trace_advice(div).cause.startswith("the adapter weights differ")


def test_per_row_backward_parts_at_the_first_gradient(toy_model_dir: Path, tmp_path: Path) -> None:
    a = traced_step(lora_model(toy_model_dir), tmp_path / "a.jsonl", forwards=1)
    b = traced_step(lora_model(toy_model_dir), tmp_path / "b.jsonl", forwards=1, per_row=True)
    div = compare_traces(a, b, step=0, exact=True)
    assert div is not None
    assert (div.kind, div.module, div.direction) == ("backward", "lm_head", "backward")
    assert div.first_of_kind and not div.structural
    assert "backpropagated differently" in trace_advice(div).cause
    # the per-row backward reaches every output once per row: more entries in run B
    assert len(b) > len(a)


def test_structural_divergence(toy_model_dir: Path, tmp_path: Path) -> None:
    a = traced_step(lora_model(toy_model_dir), tmp_path / "a.jsonl", forwards=1)
    b = traced_step(lora_model(toy_model_dir), tmp_path / "b.jsonl", forwards=2)
    div = compare_traces(a, b, step=0)
    assert div is not None and div.structural and div.rel == math.inf
    assert div.kind == "param_grad" or div.kind == "final_grad"  # A stops, B runs forward 2
    assert div.other is not None and div.other.startswith("forward model.embed_tokens call 1")
    assert "different work" in trace_advice(div).cause
    shorter = compare_traces(a, a[:-3], step=0)
    assert shorter is not None and shorter.structural and shorter.other == "nothing more"


def test_tolerance_and_within_tolerance() -> None:
    a = [("forward", "x", 0, 1.0), ("forward", "y", 0, 2.0), ("backward", "y", 0, 3.0)]
    b = [("forward", "x", 0, 1.0), ("forward", "y", 0, 2.0 * (1 + 1e-9)), ("backward", "y", 0, 3.5)]
    div = compare_traces(a, b, step=4)
    assert div is not None and div.module == "y" and div.kind == "backward"
    assert not div.within_tol and div.rel == pytest.approx(0.5 / 3.5)
    exact = compare_traces(a, b, step=4, exact=True)
    assert exact is not None and exact.kind == "forward" and exact.module == "y"
    c = [("forward", "x", 0, 1.0), ("forward", "y", 0, 2.0 * (1 + 1e-9)), ("backward", "y", 0, 3.0)]
    within = compare_traces(a, c, step=4)
    assert within is not None and within.within_tol and within.module == "y"
    assert "within the tolerances" in trace_advice(within).cause
    nan = [("forward", "x", 0, math.nan), ("forward", "y", 0, None)]
    assert compare_traces(nan, list(nan), step=0, exact=True) is None
    assert compare_traces(nan, [nan[0], ("forward", "y", 0, 1.0)], step=0) is not None


def test_file_format_replace_and_errors(toy_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir()
    model = lora_model(toy_model_dir)
    traced_step(model, path, step=2, forwards=1)  # a directory: run/trace.jsonl
    traced_step(model, path, step=3, forwards=1)
    traced_step(model, path, step=2, forwards=2)  # the step again: replaces its row
    rows = [json.loads(line) for line in (path / "trace.jsonl").read_text().splitlines()]
    assert [(r["format"], r["step"], r["phase"]) for r in rows] == [
        (TRACE_FORMAT, 3, "train"),
        (TRACE_FORMAT, 2, "train"),
    ]
    assert all(len(e) == 4 for e in rows[1]["entries"])
    assert any(e[2] == 1 for e in rows[1]["entries"])  # the two-forward version won
    assert read_trace(path / "trace.jsonl", 9) is None
    assert read_trace(tmp_path / "nope.jsonl", 2) is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"format": TRACE_FORMAT, "step": 1, "entries": [["up", "x"]]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: malformed trace entry"):
        read_trace(bad, 1)
    bad.write_text("{torn\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1"):
        read_trace(bad, 1)


def test_failed_step_writes_nothing_and_removes_hooks(toy_model_dir: Path, tmp_path: Path) -> None:
    model = lora_model(toy_model_dir)
    with pytest.raises(RuntimeError, match="boom"), StepTrace(model, tmp_path / "t.jsonl", 0) as tr:
        model(IDS)
        raise RuntimeError("boom")
    assert not (tmp_path / "t.jsonl").exists()
    n = len(tr.entries)
    model(IDS).sum().backward()  # hooks are gone: nothing more is recorded
    assert len(tr.entries) == n
    assert all(not m._forward_hooks for m in model.modules())


def test_compare_names_the_first_module(toy_model_dir: Path, tmp_path: Path) -> None:
    """`compare` reads trace.jsonl beside each diag.jsonl at the first divergent step."""
    runs = {}
    for name, bump in (("a", 0.0), ("b", 0.5), ("c", 0.5)):
        run = tmp_path / name
        model = lora_model(toy_model_dir)
        with torch.no_grad():
            model.get_submodule("model.layers.1.self_attn.o_proj").lora_B.weight[0, 0] += bump
        with DiagRecorder(run) as rec:
            rec.record(0, {"loss": 1.0})
            if name != "c":  # run c has no trace
                traced_step(model, run, step=1, forwards=1)
            logits = model(IDS)
            rec.record(1, {"forward.logits": logits.detach(), "loss": 2.0})
        runs[name] = run
    r = compare(runs["a"], runs["b"])
    assert r.first is not None and r.first.step == 1 and r.first.leaf == "forward.logits"
    fm = r.first_module
    assert fm is not None and fm.step == 1
    assert (fm.kind, fm.module) == ("forward", "model.layers.1.self_attn.o_proj.lora_B")
    assert r.trace_note is None
    d = r.to_dict()
    assert d["first_module"]["module"] == fm.module and d["first_module"]["direction"] == "forward"
    r = compare(runs["a"], runs["c"] / "diag.jsonl")
    assert r.first_module is None and r.trace_note is not None
    assert r.trace_note.startswith("run B has no trace at step=1: rerun both with --trace-step 1")
    assert compare(runs["a"], runs["a"]).first_module is None


def test_trace_advice_kinds() -> None:
    def div(kind: str, module: str, **kw: object) -> TraceDivergence:
        return TraceDivergence("train", 1, kind, "x", module, 0, 1.0, 2.0, 0.5, 9, **kw)  # type: ignore[arg-type]

    assert "input" in trace_advice(div("forward", "model.embed_tokens")).cause
    assert "normalisation" in trace_advice(div("forward", "model.layers.0.input_layernorm")).cause
    assert "attention" in trace_advice(div("forward", "model.layers.0.self_attn")).cause
    assert "matmul" in trace_advice(div("forward", "model.layers.0.mlp.up_proj")).cause
    assert "nondeterministic backward" in trace_advice(div("backward", "model.norm")).cause
    assert "accumulated into this parameter" in trace_advice(div("param_grad", "w")).cause
    assert "after the backward" in trace_advice(div("final_grad", "w")).cause


def test_docs_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tested example of docs/diagnostics.md runs and prints what its comments say."""
    doc = Path(__file__).resolve().parents[3] / "docs" / "diagnostics.md"
    text = doc.read_text(encoding="utf-8")
    block = text.split("<!-- tested-example:begin -->", 1)[1].split("<!-- tested-example:end -->")[
        0
    ]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(doc), "exec"), {"__name__": "docs_example"})
    assert capsys.readouterr().out.splitlines() == ["0 forward.logits", "forward 2"]
    assert (tmp_path / "runs" / "a" / "diag.jsonl").is_file()
    assert read_trace(tmp_path / "runs" / "a" / "trace.jsonl", 3) is not None
