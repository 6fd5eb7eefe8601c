"""The objective registry is the one list of objectives: no other module spells an objective's
name, each record's attributes are ones the rest of twinrun knows, and the command line built
from it imports no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from twinrun.objectives.registry import NAMES, OBJECTIVES, names, objective

SRC = Path(__file__).resolve().parents[3] / "src" / "twinrun"
REGISTRY = "objectives/registry.py"

# (file under src/twinrun, name) -> why that file may spell the name. Kept short on purpose: a
# new entry needs a reason a reviewer accepts.
ALLOWED: dict[tuple[str, str], str] = {
    ("train/recipes/sft.py", "sft"): "SFT's own recipe",
    ("train/recipes/text.py", "text"): "text's own recipe",
    ("train/recipes/grpo.py", "grpo"): "GRPO's own recipe",
    ("train/recipes/pairs.py", "dpo"): "DPO's own recipe class",
    ("train/recipes/pairs.py", "ipo"): "IPO's own recipe class",
    ("train/recipes/pairs.py", "simpo"): "SimPO's own recipe class",
    ("train/recipes/pairs.py", "reward"): "the reward model's own recipe class",
    ("golden/suite.py", "sft"): "the suite's fixed run of each objective, and its sft adapter",
    ("golden/suite.py", "dpo"): "the suite's fixed run of each objective",
    ("golden/suite.py", "ipo"): "the suite's fixed run of each objective",
    ("golden/suite.py", "simpo"): "the suite's fixed run of each objective",
    ("golden/suite.py", "reward"): "the suite's fixed run of each objective",
    ("golden/suite.py", "grpo"): "the suite's fixed run of each objective",
    ("golden/suite.py", "text"): "the suite's fixed run of each objective, and its text adapter",
    ("demo/steps.py", "sft"): "the tour shows one sft run",
    ("cli/generate.py", "text"): "the word: generate's result key for the decoded text",
    ("infer/generate.py", "text"): "the word: generate's result key for the decoded text",
    ("diag/rows.py", "text"): "the word: a diag row's source text",
    ("rl/environments.py", "reward"): "the word: an environment's reward method",
    ("rl/env_checks.py", "reward"): "the word: the reward method a checked call names",
    ("rl/tool_base.py", "reward"): "the word: a tool environment's reward method or attribute",
    ("rl/tool_plugins.py", "reward"): "the word: OpenEnv's step-result field and reward method",
    ("rl/tool_plugins.py", "text"): "the word: an observation's or MCP content's text field",
    ("data/examples.py", "text"): "the word: TRL's {text} language-modelling column",
    ("train/recipes/transcripts.py", "reward"): "the word: a transcript line's reward field",
}


def spelled(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string constant in `path` that is exactly an objective's name
    (docstrings and messages that mention a name inside a sentence do not count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
    )


def test_no_module_but_the_registry_lists_the_objectives() -> None:
    hits, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == REGISTRY:
            continue
        for line, name in spelled(path):
            if (rel, name) in ALLOWED:
                used.add((rel, name))
            else:
                hits.append(f"src/twinrun/{rel}:{line}: {name!r}")
    assert hits == [], "read objectives/registry.py instead of spelling the name:\n" + "\n".join(
        hits
    )
    assert set(ALLOWED) - used == set(), "stale allow-list entries"


def test_the_scan_sees_names_where_they_are() -> None:
    assert [name for _, name in spelled(SRC / REGISTRY)] == list(NAMES)
    assert spelled(SRC / "train" / "recipes" / "sft.py") != []


def test_records_are_unique_and_say_what_the_rest_of_twinrun_knows() -> None:
    from twinrun.config.run import applies
    from twinrun.train.step.faults import FAULTS

    assert len(NAMES) == len(set(NAMES)) == len(OBJECTIVES)
    for o in OBJECTIVES:
        assert objective(o.name) is o
        assert set(o.faults) <= set(FAULTS), o.name
        assert applies("steps" if o.counts == "steps" else "epochs", o.name), o.name
        assert applies("examples", o.name) == o.reads_examples, o.name
    assert names(counts="epochs") == ("sft", "dpo", "ipo", "simpo", "reward")
    assert names(has_reference=True) == ("dpo", "ipo")
    assert names(samples=True) == ("grpo",)


def test_the_recipes_are_the_registry_s_objectives() -> None:
    from twinrun.train.recipes import RECIPES

    assert tuple(RECIPES) == NAMES
    for name, kind in RECIPES.items():
        assert kind.name == name


@pytest.mark.parametrize("name", names(data="pairs"))
def test_each_pair_recipe_s_loss_agrees_with_its_record(name: str) -> None:
    from twinrun.config.run import SETTINGS, applies
    from twinrun.train.recipes import RECIPES
    from twinrun.train.recipes.pairs import PairRecipe

    kind = RECIPES[name]
    assert issubclass(kind, PairRecipe)
    record = objective(name)
    assert kind.loss.needs_reference == record.has_reference
    import dataclasses

    # the settings the loss reads are the ones its record declares, and they apply to it
    fields = [f.name for kind_ in kind.loss.settings for f in dataclasses.fields(kind_)]
    assert sorted(fields) == sorted(record.settings), (name, fields)
    assert all(f in SETTINGS and applies(f, name) for f in fields), (name, fields)


def test_the_golden_suite_runs_every_objective() -> None:
    from twinrun.golden.suite import run_settings

    data = {n: Path(n) for n in ("sft.jsonl", "pairs.jsonl", "arith.jsonl", "text")}
    assert tuple(run_settings(data, "cpu")) == NAMES


def test_registry_and_tune_help_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import twinrun.objectives.registry\n"
        "assert 'torch' not in sys.modules, 'registry'\n"
        "from twinrun.cli.main import run_cli\n"
        "for args in (['tune', '--help'], ['tune', 'sft', '--help'], ['run', '--help']):\n"
        "    assert run_cli(args) == 0, args\n"
        "    assert 'torch' not in sys.modules, args\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for name in NAMES:
        assert f"\n  {name} " in res.stdout
