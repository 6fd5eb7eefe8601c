"""Child of bench/trl_tokens.py, run by the interpreter of the benchmark's TRL environment
(`bench/.venv-trl`): each case's row tokenized by TRL's own trainers, as a TRL user gets it.

- SFT rows: `SFTTrainer(args=SFTConfig(**case["trl"]), train_dataset=Dataset.from_list([row]))`
  prepares the one-row dataset (TRL's eos rule, tokenization, `assistant_masks` /
  `completion_mask` folded into `labels`); the ids and labels are those of the trainer's own
  collator on that row, a target wherever the label is not -100.
- Pairs: `DPOTrainer(...)` prepares the row (TRL's `extract_prompt` for an implicit prompt, the
  eos rule, `prompt_ids` / `chosen_ids` / `rejected_ids`); the ids and `completion_mask` of each
  side are those of its collator.

The tokenizer is the checkpoint's, its chat template replaced by the case's (in memory): a
template given in SETTINGS by name, or `qwen2_5-training`, TRL's own training variant of the
Qwen2.5 template (`trl.chat_template_utils.qwen2_5_training_chat_template`). The model is loaded
once because the trainers take one; nothing runs it. Not part of the package.

    bench/.venv-trl/bin/python bench/trl_tokens_child.py SETTINGS.json

SETTINGS: model, templates ({name: jinja text}), cases ([{name, kind, template, trl, row}]),
output, work. The output JSON: versions, every template's text and TRL's checks of it, TRL's
answer for the checkpoint's own template, and per case its sides ([{input_ids, mask}]), the
trainer's resolved loss flags and what TRL warned.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any


class Caught(logging.Handler):
    """The messages TRL's loggers emit (its prefix warning among them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def template_checks(tok: Any) -> dict[str, Any]:
    from trl.chat_template_utils import has_generation_markers, is_chat_template_stop_token_trained

    return {
        "has_generation_markers": has_generation_markers(tok.chat_template),
        "stop_token_trained": is_chat_template_stop_token_trained(tok),
    }


def own_template_answer(model: str) -> dict[str, str]:
    """What TRL's `get_training_chat_template` (what `assistant_only_loss` calls on a template
    without markers) says of the checkpoint's own template."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template

    try:
        patched = get_training_chat_template(AutoTokenizer.from_pretrained(model))
    except ValueError as exc:
        return {"answer": "refused", "message": str(exc)}
    return {"answer": "no patch needed" if patched is None else "patched by TRL", "message": ""}


def sft_sides(model: Any, tok: Any, case: dict[str, Any], out: str) -> tuple[list, dict]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        output_dir=out, report_to="none", use_cpu=True, max_length=None, **case["trl"]
    )  # fmt: skip
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_list([case["row"]]),
        processing_class=tok,
    )  # fmt: skip
    batch = trainer.data_collator([trainer.train_dataset[0]])
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    flags = {
        "completion_only_loss": trainer.completion_only_loss,
        "assistant_only_loss": config.assistant_only_loss,
    }
    return [{"input_ids": ids, "mask": [int(label != -100) for label in labels]}], flags


def dpo_sides(model: Any, tok: Any, case: dict[str, Any], out: str) -> tuple[list, dict]:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    config = DPOConfig(
        output_dir=out, report_to="none", use_cpu=True, max_length=None, **case["trl"]
    )  # fmt: skip
    trainer = DPOTrainer(
        model=model, args=config, train_dataset=Dataset.from_list([case["row"]]),
        processing_class=tok,
    )  # fmt: skip
    prepared = trainer.train_dataset[0]
    batch = trainer.data_collator([prepared])
    sides = []
    for i in (0, 1):  # chosen, rejected: padded to the longer, the padding cut off here
        n = int(batch["attention_mask"][i].sum())
        ids, mask = batch["input_ids"][i].tolist(), batch["completion_mask"][i].tolist()
        sides.append({"input_ids": ids[:n], "mask": mask[:n]})
    return sides, {"prompt": prepared["prompt"]}


def main(settings_path: str) -> None:
    s: dict[str, Any] = json.loads(Path(settings_path).read_text(encoding="utf-8"))
    import torch

    torch.set_num_threads(1)
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_training_chat_template

    datasets.disable_progress_bars()
    caught = Caught()
    logging.getLogger("trl").addHandler(caught)
    templates = {**s["templates"], "qwen2_5-training": qwen2_5_training_chat_template}

    def tokenizer(name: str) -> Any:  # a fresh one per case: the trainers set its pad token
        tok = AutoTokenizer.from_pretrained(s["model"])
        tok.chat_template = templates[name]
        return tok

    model = AutoModelForCausalLM.from_pretrained(s["model"])
    cases = {}
    for case in s["cases"]:
        before = len(caught.messages)
        tok = tokenizer(case["template"])
        sides_of = sft_sides if case["kind"] == "sft" else dpo_sides
        sides, resolved = sides_of(model, tok, case, str(Path(s["work"]) / case["name"]))
        cases[case["name"]] = {
            "sides": sides, "resolved": resolved, "warnings": caught.messages[before:],
        }  # fmt: skip
    result = {
        "versions": {
            "trl": trl.__version__, "transformers": transformers.__version__,
            "datasets": datasets.__version__, "torch": torch.__version__,
        },
        "templates": templates,
        "template_checks": {name: template_checks(tokenizer(name)) for name in templates},
        "own_template": own_template_answer(s["model"]),
        "cases": cases,
    }  # fmt: skip
    Path(s["output"]).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
