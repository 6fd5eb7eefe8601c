"""Check: twinrun's token ids and loss masks against TRL's own tokenization, row by row.

`tests/real/test_smollm2_tokens.py` pins twinrun's ids on SmolLM2-135M-Instruct against TRL's
rule written out by hand, because TRL is not a dependency. This script asks TRL itself: each case
below is one row, tokenized

- by TRL 1.x (`bench/trl_tokens_child.py`, in the benchmark's own environment `bench/.venv-trl`,
  made by `grpo_vs_trl.trl_python`): `SFTTrainer`'s dataset preparation and collator with
  `assistant_only_loss=True` for `messages` rows and `completion_only_loss=True` (what TRL's
  default resolves to) for prompt-completion rows; `DPOTrainer`'s for the pairs;
- by twinrun: `encode_sft_rows` / `encode_pairs` with the tokenizer `load_tokenizer` gives for
  a checkpoint carrying the same template (`--chat-template on` for conversational rows, `off`
  for strings, as TRL applies the template to conversations only),

and the two compared exactly: the ids, and the loss mask (TRL: a label that is not -100, or
DPO's `completion_mask`; twinrun: `loss_mask`). Where they differ, the first differing id, or
every differing mask position, is written with its token.

The template. TRL's `assistant_only_loss` needs a chat template with `{% generation %}` markers
(`return_assistant_tokens_mask`), and SmolLM2's has none: TRL refuses it ("patching is not
supported for this template"; the child records TRL's answer). So, as TRL does for the model
families it knows (its `chat_templates/*_training.jinja`: the original with the markers added,
the same text rendered), the cases run on a copy of SmolLM2's template with the markers around
each assistant message's content and end of turn (`<|im_end|>` and the newline after it);
twinrun's encodings on SmolLM2's unmarked template are checked to be the same. SmolLM2's template
ignores `tools` and `tool_calls`, so one tool case runs again on TRL's own training variant of
Qwen2.5's template (`qwen2_5_training.jinja`, shipped in TRL), which renders them, on the same
SmolLM2 vocabulary. Its one difference is known and accepted only in exactly its shape
(`HEADER_NEWLINE`); any other difference makes the exit status 1.

    python -m bench trl_tokens

Writes bench/results/trl_tokens.json, .md, the `trl_tokens` section of docs/benchmarks.md and
the figures in docs/comparison.md (between `<!-- trl_tokens_figures:begin/end -->`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import benchkit
from benchkit import cpu_name, git, package_versions, smollm2_dir, update_docs_section
from grpo_vs_trl import trl_python

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
COMPARISON = ROOT / "docs" / "comparison.md"
MAX_LENGTH = 8192

# SmolLM2's template writes every message as one expression; the marked copy splits an
# assistant message after its header, so the markers hold its content and end of turn.
TURN = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
MARKED_TURN = (
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{message['content'] + '<|im_end|>' + '\n'}}{% endgeneration %}"
    "{% else %}{{message['content'] + '<|im_end|>' + '\n'}}{% endif %}"
)


def marked_template(own: str) -> str:
    """SmolLM2's template with `{% generation %}` around each assistant turn's content and end
    of turn; it must hold the expression the markers split exactly once."""
    if own.count(TURN) != 1:
        sys.exit("SmolLM2's chat template is not the one this script marks; update TURN")
    return own.replace(TURN, MARKED_TURN)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "You are a terse arithmetic tutor."}
TOOLS = [{
    "type": "function",
    "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {
            "type": "object", "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}]  # fmt: skip
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
TOOL_TURNS = [
    user("What is 2 + 3?"),
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "content": "5"},
    assistant("2 + 3 = 5."),
]
SFT_MESSAGES = {"assistant_only_loss": True}
SFT_COMPLETION = {"completion_only_loss": True}
MARKED = "smollm2-marked"


# A difference understood and expected, accepted only in the exact shape described: TRL's
# Qwen2.5 training template opens `{% generation %}` before the newline that ends the assistant
# header, so TRL trains that newline; twinrun's turn starts after the generation prompt
# (`<|im_start|>assistant` and that newline), which the model is given, not asked to write.
HEADER_NEWLINE = (
    "known: TRL's template opens `{% generation %}` before the newline ending "
    "`<|im_start|>assistant`, so TRL also trains that newline, one per assistant turn"
)


def case(name: str, kind: str, about: str, row: dict[str, Any], trl: dict[str, Any],
         chat: bool = True, template: str = MARKED, known: str = "") -> dict[str, Any]:  # fmt: skip
    return {"name": name, "kind": kind, "about": about, "row": row, "trl": trl, "chat": chat,
            "template": template, "known": known}  # fmt: skip


CASES = [
    case("plain", "sft", "prompt-completion, strings",
         {"prompt": "What is 1 + 1?", "completion": "2"}, SFT_COMPLETION, chat=False),
    case("plain-merge", "sft", "strings; the prompt's final space merges with the answer",
         {"prompt": "Say hi: ", "completion": "hi"}, SFT_COMPLETION, chat=False),
    case("conversational", "sft", "prompt-completion, one user and one assistant message",
         {"prompt": [user("What is the capital of France?")],
          "completion": [assistant("The capital of France is Paris.")]}, SFT_COMPLETION),
    case("conversational-history", "sft",
         "prompt-completion; the prompt holds a system message and an earlier exchange",
         {"prompt": [SYSTEM, user("What is 2+2?"), assistant("4."), user("And 3+3?")],
          "completion": [assistant("6.")]}, SFT_COMPLETION),
    case("messages-2", "sft", "`messages`, 2 assistant turns",
         {"messages": [user("What is 2+2?"), assistant("4."), user("And 3+3?"),
                       assistant("6.")]}, SFT_MESSAGES),
    case("messages-system-3", "sft", "`messages`, a system message and 3 assistant turns",
         {"messages": [SYSTEM, user("2*3?"), assistant("6."), user("Times 2?"),
                       assistant("12."), user("Minus 5?"), assistant("7.")]}, SFT_MESSAGES),
    case("tools", "sft",
         "`messages` with `tool_calls` and a `tool` message, `tools` schemas (SmolLM2's "
         "template renders neither `tools` nor `tool_calls`)",
         {"messages": TOOL_TURNS, "tools": json.dumps(TOOLS)}, SFT_MESSAGES),
    case("tools-qwen2.5", "sft",
         "the same row on TRL's Qwen2.5 training template, which renders both",
         {"messages": TOOL_TURNS, "tools": json.dumps(TOOLS)}, SFT_MESSAGES,
         template="qwen2_5-training", known=HEADER_NEWLINE),
    case("dpo-implicit", "dpo", "DPO pair, implicit prompt: two conversations",
         {"chosen": [user("What color is the sky?"), assistant("It is blue.")],
          "rejected": [user("What color is the sky?"), assistant("It is green.")]}, {}),
    case("dpo-implicit-plain", "dpo", "DPO pair, implicit prompt: two strings",
         {"chosen": "The sky is blue.", "rejected": "The sky is green."}, {}, chat=False),
    case("dpo-merge", "dpo",
         "DPO pair, strings; the prompt's final space merges with one answer, not the other",
         {"prompt": "Say hi: ", "chosen": "hi", "rejected": "42"}, {}, chat=False),
    case("dpo-system", "dpo", "DPO pair, conversational prompt with a system message",
         {"prompt": [SYSTEM, user("What is 7 * 8?")], "chosen": [assistant("56.")],
          "rejected": [assistant("54.")]}, {}),
]  # fmt: skip


def run_trl(model: Path, templates: dict[str, str], work: Path) -> dict[str, Any]:
    settings = {"model": str(model), "templates": templates, "cases": CASES,
                "output": str(work / "trl.json"), "work": str(work / "trl")}  # fmt: skip
    (work / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run(
        [str(trl_python()), str(ROOT / "bench" / "trl_tokens_child.py"),
         str(work / "settings.json")],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"the TRL child failed:\n{proc.stderr[-4000:]}")
    return json.loads((work / "trl.json").read_text(encoding="utf-8"))


def twinrun_tokenizer(model: Path, template: str, out: Path) -> Any:
    """twinrun's tokenizer of a checkpoint directory holding the checkpoint's tokenizer with
    `template` as its chat template (written by transformers' `save_pretrained`)."""
    from twinrun.model.tokens import load_tokenizer

    base = load_tokenizer(model)
    base.hf.chat_template = template
    out.mkdir(parents=True)
    base.hf.save_pretrained(out)
    (out / "generation_config.json").write_bytes((model / "generation_config.json").read_bytes())
    tok = load_tokenizer(out)
    assert tok.chat_template == template and tok.end_ids == base.end_ids
    return tok


def twinrun_sides(tok: Any, c: dict[str, Any]) -> tuple[list[dict[str, list[int]]], list[str]]:
    from twinrun.data.examples import SourcedRow, encode_sft_rows
    from twinrun.data.pairs import encode_pairs
    from twinrun.model.tokens import CheckpointTokenizer

    tok = CheckpointTokenizer(tok.hf, tok.end_ids, tok.source)  # it warns once: fresh per case
    row = [SourcedRow(c["row"], c["name"])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if c["kind"] == "sft":
            encoded = encode_sft_rows(tok, row, c["chat"], MAX_LENGTH)
        else:
            (pair,) = encode_pairs(tok, row, c["chat"], MAX_LENGTH)
            encoded = [pair.chosen, pair.rejected]
    sides = [{"input_ids": list(e.input_ids), "mask": list(e.loss_mask)} for e in encoded]
    return sides, [str(w.message) for w in caught]


def token(tok: Any, ids: list[int], i: int) -> str:
    return f"`{tok.hf.convert_ids_to_tokens(ids[i])}` ({ids[i]})" if i < len(ids) else "(end)"


def compare(tok: Any, trl: dict[str, list[int]], tw: dict[str, list[int]]) -> dict[str, Any]:
    """Equal, or the first id that differs, or every mask position that differs."""
    a, b = trl["input_ids"], tw["input_ids"]
    loss_tokens = {"trl": sum(trl["mask"]), "twinrun": sum(tw["mask"])}
    out: dict[str, Any] = {"tokens": len(b), "loss_tokens": loss_tokens}
    if a != b:
        i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                 min(len(a), len(b)))  # fmt: skip
        out["ids"] = {"position": i, "trl": token(tok, a, i), "twinrun": token(tok, b, i),
                      "trl_tokens": len(a)}  # fmt: skip
        return out
    where = [i for i, (x, y) in enumerate(zip(trl["mask"], tw["mask"], strict=True)) if x != y]
    if where:
        out["mask"] = [
            {"position": i, "token": token(tok, a, i),
             "trained_by": "trl" if trl["mask"][i] else "twinrun"}
            for i in where
        ]  # fmt: skip
    return out


def header_newlines(tok: Any, c: dict[str, Any], diff: dict[str, Any], ids: list[int]) -> bool:
    """HEADER_NEWLINE, exactly: the ids equal, and the masks part only at the newline right
    after `<|im_start|>assistant`, trained by TRL alone, once per assistant turn."""
    head, newline = tok.encode("<|im_start|>assistant"), tok.encode("\n")
    parts = diff.get("mask", [])
    turns = sum(m["role"] == "assistant" for m in c["row"]["messages"])
    return "ids" not in diff and len(parts) == turns and all(
        m["trained_by"] == "trl" and ids[m["position"] - len(head) : m["position"]] == head
        and ids[m["position"] : m["position"] + 1] == newline
        for m in parts
    )  # fmt: skip


def status(tok: Any, c: dict[str, Any], diffs: list[dict[str, Any]], trl: list[dict]) -> str:
    """`equal`, `known` (the case's known difference and nothing else) or `differs`."""
    if all(set(d) == {"tokens", "loss_tokens"} for d in diffs):
        return "equal"
    if c["known"] == HEADER_NEWLINE and len(diffs) == 1:
        return "known" if header_newlines(tok, c, diffs[0], trl[0]["input_ids"]) else "differs"
    return "differs"


def measure(model: Path, work: Path) -> dict[str, Any]:
    from twinrun.model.tokens import load_tokenizer

    own = str(load_tokenizer(model).chat_template)
    trl = run_trl(model, {MARKED: marked_template(own)}, work)
    tokenizers = {name: twinrun_tokenizer(model, text, work / "tokenizers" / name)
                  for name, text in trl["templates"].items()}  # fmt: skip
    own_tok = twinrun_tokenizer(model, own, work / "tokenizers" / "smollm2")
    rows = []
    for c in CASES:
        tok = tokenizers[c["template"]]
        sides, tw_warnings = twinrun_sides(tok, c)
        theirs = trl["cases"][c["name"]]
        diffs = [compare(tok, t, s) for t, s in zip(theirs["sides"], sides, strict=True)]
        row = {k: c[k] for k in ("name", "kind", "about", "template", "chat", "trl", "row")}
        row.update(sides=diffs, status=status(tok, c, diffs, theirs["sides"]), known=c["known"],
                   trl_resolved=theirs["resolved"], trl_warnings=theirs["warnings"],
                   twinrun_warnings=tw_warnings, ids_and_masks={"trl": theirs["sides"],
                                                                "twinrun": sides})  # fmt: skip
        if c["template"] == MARKED and c["chat"]:  # the markers render nothing
            row["same_on_smollm2_own_template"] = twinrun_sides(own_tok, c)[0] == sides
        rows.append(row)
    return {"trl": {k: trl[k] for k in ("versions", "template_checks", "own_template")},
            "templates": trl["templates"], "cases": rows}  # fmt: skip


def side_text(d: dict[str, Any]) -> str:
    if "ids" in d:
        x = d["ids"]
        return (f"ids differ at {x['position']}: TRL {x['trl']}, twinrun {x['twinrun']} "
                f"({x['trl_tokens']} vs {d['tokens']} tokens)")  # fmt: skip
    if "mask" in d:
        parts = [f"{m['position']} {m['token']}" for m in d["mask"]]
        who = {m["trained_by"] for m in d["mask"]}
        only = "twinrun" if who == {"twinrun"} else "TRL" if who == {"trl"} else "one side"
        return f"mask differs at {len(parts)}, trained by {only} only: " + ", ".join(parts)
    return "equal"


def trl_path(c: dict[str, Any]) -> str:
    if c["kind"] == "dpo":
        return "`DPOTrainer`"
    flags = ", ".join(f"`{k}`" for k, v in c["trl"].items() if v)
    return f"`SFTTrainer`, {flags}"


def summary(cases: list[dict[str, Any]]) -> str:
    """How many cases are equal, and what the others are, with the first difference of each."""
    equal = [c for c in cases if c["status"] == "equal"]
    text = f"**{len(equal)} of {len(cases)}** cases equal, ids and loss masks"
    for c in cases:
        if c["status"] != "equal":
            first = next(side_text(d) for d in c["sides"] if side_text(d) != "equal")
            what = c["known"] if c["status"] == "known" else "NOT EXPECTED"
            text += f"; {c['name']}: {first} ({what})"
    return text + "."


def render(meta: dict[str, Any], result: dict[str, Any]) -> str:
    cases = result["cases"]
    lines = [
        f"Checked {meta['when']} by `{meta['command']}` on {meta['cpu_count']} CPUs "
        f"({meta['cpu']}), commit {meta['git_commit']}: twinrun (torch {meta['torch']}, "
        f"transformers {meta['transformers']}) against TRL {meta['trl']['trl']} (transformers "
        f"{meta['trl']['transformers']}, datasets {meta['trl']['datasets']}; in "
        "`bench/.venv-trl` only), on SmolLM2-135M-Instruct's tokenizer. Templates: "
        f"`{MARKED}` is SmolLM2's own with `{{% generation %}}` markers around each assistant "
        "message's content and end of turn (TRL's answer for SmolLM2's own template and "
        f"`assistant_only_loss`: {meta['own_template']['answer']}); `qwen2_5-training` is TRL's "
        "training variant of Qwen2.5's template, which renders `tools` and `tool_calls`.", "",
        summary(cases), "",
        "| case | row | template | TRL | tokens | loss tokens TRL / twinrun | result |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for c in cases:
        labels = ["chosen: ", "rejected: "] if c["kind"] == "dpo" else [""]
        for side, d in zip(labels, c["sides"], strict=True):
            lt = d["loss_tokens"]
            result_text = side_text(d)
            if result_text != "equal":
                result_text += " — " + (c["known"] if c["status"] == "known" else "NOT EXPECTED")
            lines.append(
                f"| {c['name']} | {side}{c['about']} | "
                f"{'plain (no template)' if not c['chat'] else c['template']} | {trl_path(c)} | "
                f"{d['tokens']} | {lt['trl']} / {lt['twinrun']} | {result_text} |"
            )
    same = [c["name"] for c in cases if c.get("same_on_smollm2_own_template") is False]
    lines += ["", "twinrun on SmolLM2's unmarked template: "
              + ("the same ids and masks in every case." if not same
                 else f"different in {', '.join(same)}.")]  # fmt: skip
    checks = result["trl"]["template_checks"]
    lines += ["", "TRL's checks of the templates: " + "; ".join(
        f"`{name}`: generation markers {v['has_generation_markers']}, end of turn trained "
        f"{v['stop_token_trained']}" for name, v in checks.items()) + "."]  # fmt: skip
    warned = [(c["name"], w) for c in cases for w in c["trl_warnings"]]
    for name, w in warned:
        lines += ["", f"TRL warned on `{name}`: {w.removeprefix('[RANK 0] ').split('. ')[0]}."]
    for c in cases:
        for w in c["twinrun_warnings"]:
            lines += ["", f"twinrun warned on `{c['name']}`: {w.split(';')[0]}."]
    return "\n".join(lines)


def figures(result: dict[str, Any]) -> str:
    """The lines docs/comparison.md quotes; every bold figure is in bench/results/trl_tokens.md."""
    return (f"Against TRL {result['trl']['versions']['trl']}'s own trainers, on "
            f"SmolLM2-135M-Instruct's tokenizer (`bench/results/trl_tokens.md`): "
            + summary(result["cases"]))  # fmt: skip


def main() -> None:
    import twinrun

    model = smollm2_dir()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(model, Path(tmp))
    own = result["trl"]["own_template"]
    meta = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench trl_tokens", "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        **package_versions("torch", "transformers", "peft"), "trl": result["trl"]["versions"],
        "git_commit": git("rev-parse", "--short", "HEAD"),
        # this checkout's twinrun, or the one installed elsewhere (then the commit is not its)
        "twinrun_from_this_checkout": Path(twinrun.__file__).resolve().is_relative_to(ROOT),
        "own_template": own,
    }  # fmt: skip
    md = render(meta, result)
    print(md)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trl_tokens.json").write_text(
        json.dumps({"meta": meta, **result}, indent=1) + "\n", encoding="utf-8"
    )
    (RESULTS / "trl_tokens.md").write_text(
        "# Token ids and loss masks: twinrun vs TRL\n\n" + md + "\n", encoding="utf-8"
    )
    update_docs_section(
        "trl_tokens", "trl_tokens — token ids and loss masks, twinrun vs TRL's own trainers",
        "`python -m bench trl_tokens` (the TRL side runs in `bench/.venv-trl` only).", md,
    )  # fmt: skip
    update_docs_section("trl_tokens_figures", "", "", figures(result), docs=COMPARISON)
    sys.exit(0 if all(c["status"] != "differs" for c in result["cases"]) else 1)


if __name__ == "__main__":
    main()
