"""A checkpoint's tokenizer, with the tokenization rules of TRL 1.x.

`load_tokenizer(model_dir)` loads the tokenizer with transformers' `AutoTokenizer` (tokenizer.json,
SentencePiece models, chat templates in tokenizer_config.json or chat_template.jinja) and returns
a `CheckpointTokenizer`, which turns rows into token ids exactly as TRL's trainers do:

- conversational rows (chat template on): the prompt ids are
  `apply_chat_template(messages, add_generation_prompt=True)`; the full ids are the template of
  the messages plus the assistant's completion; the completion is the tokens of the full ids after
  their common prefix with the prompt ids (a warning, once, when the prompt ids are not a prefix
  of the full ids: the template renders the prompt differently once an answer follows it);
- plain rows (chat template off): the tokenizer's own special-token rule
  (`tokenizer(text, add_special_tokens=True)`) on the prompt and on prompt + completion + the eos
  token's text (not doubled when the completion already ends with it); the completion is again
  what follows the common prefix.

A template renders its own special tokens (a BOS included), so its text is tokenized with
`add_special_tokens=False`, as transformers does: no BOS is ever added twice. `end_ids` are the
ids generation stops at: every `eos_token_id` of generation_config.json (an int or a list, e.g. the
template's end-of-turn token) and the tokenizer's eos.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import ModelError
from twinrun.model.chat_template import check_render

# Any one of these makes a directory a tokenizer AutoTokenizer can load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# What transformers reads besides them; each must be a regular file within the cap, checked
# before transformers opens any (it would block on a FIFO and read /dev/zero without end).
TOKENIZER_READS = (
    *TOKENIZER_FILES,
    "chat_template.jinja",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "generation_config.json",
    "config.json",
)
MAX_TOKENIZER_FILE_BYTES = 1 << 30  # tokenizer.json of the largest vocabularies is ~30 MB
MAX_CONFIG_JSON_BYTES = 16 << 20

Messages = list[dict[str, str]]  # a conversation: {role, content} messages
Tools = list[dict[str, Any]] | None  # tool JSON schemas, for templates that render them


class PromptPrefixWarning(UserWarning):
    """The prompt's token ids are not a prefix of the prompt + completion ids."""


class CheckpointTokenizer:
    """A transformers tokenizer plus the checkpoint's special ids, end ids and TRL's rules."""

    def __init__(self, hf: Any, end_ids: tuple[int, ...], source: str = "the model") -> None:
        self.hf = hf
        self.source = source
        self.bos_id: int | None = hf.bos_token_id
        self.eos_id: int | None = hf.eos_token_id
        if self.eos_id is None and end_ids:
            self.eos_id = end_ids[0]
        if self.eos_id is None:
            raise ModelError(
                f"the tokenizer of {source} has no eos token",
                "set eos_token in tokenizer_config.json or eos_token_id in generation_config.json",
            )
        # Padding is masked out; without a pad token rows are padded with eos, as TRL does.
        self.pad_id: int = hf.pad_token_id if hf.pad_token_id is not None else self.eos_id
        self.end_ids: tuple[int, ...] = tuple(dict.fromkeys([*end_ids, self.eos_id]))
        self._warned_prefix = False

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.hf, "chat_template", None)
        return template if isinstance(template, str) and template else None

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def require_chat_template(self) -> None:
        """ModelError (one line) when the tokenizer has no chat template."""
        if self.chat_template is None:
            raise ModelError(
                f"--chat-template on, but the tokenizer of {self.source} has no chat template",
                "use --chat-template off, or a model whose tokenizer has a chat_template",
            )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` alone: no special tokens added (special-token text is recognised)."""
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special))

    def _check_template(
        self, messages: Messages, add_generation_prompt: bool, tools: Tools = None
    ) -> None:
        """The template rendered once within bounds of time and size (model/chat_template.py)."""
        self.require_chat_template()
        variables = {
            **self.hf.special_tokens_map,
            "messages": [dict(m) for m in messages],
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        check_render(str(self.chat_template), variables, self.source)

    def render_chat(
        self, messages: Messages, add_generation_prompt: bool, tools: Tools = None
    ) -> str:
        """The chat template rendered to text (what `apply_chat_template(tokenize=False)` gives);
        `tools` (JSON schemas) are passed to templates that render them."""
        self._check_template(messages, add_generation_prompt, tools)
        return str(
            self.hf.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False, tools=tools
            )
        )

    def end_text(self, token: int) -> str:
        """The text of a special token as a chat template writes it (e.g. `<|im_end|>`)."""
        return str(self.hf.convert_ids_to_tokens(int(token)))

    def _chat_ids(
        self, messages: Messages, add_generation_prompt: bool, tools: Tools = None
    ) -> list[int]:
        self._check_template(messages, add_generation_prompt, tools)
        ids = self.hf.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
            tools=tools,
        )
        return [int(i) for i in ids]

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token of the vocabulary stands for (its text as the
        vocabulary writes it, special tokens included, so never fewer): a text of C characters
        is at least C / this many tokens."""
        return max((len(t) for t in self.hf.get_vocab()), default=1) or 1

    @functools.cached_property
    def turn_tokens_floor(self) -> int:
        """The fewest tokens a user or assistant message adds through the chat template, even
        empty (its role markers), measured once on three tiny conversations; 0 when the
        template has none or a probe fails (then turns bound nothing)."""
        turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""},
                 {"role": "user", "content": ""}]  # fmt: skip
        try:
            n = [len(self._chat_ids(turns[:k], add_generation_prompt=False)) for k in (1, 2, 3)]
        except Exception:  # a template that refuses the probes: no floor, never a wrong one
            return 0
        return max(0, min(n[1] - n[0], n[2] - n[1]))

    def token_floor(self, messages: Messages, chat_template: bool) -> int:
        """A lower bound on the tokens of a conversation, found without tokenizing it: its
        characters over `longest_token_chars`, and through the chat template its user and
        assistant turns times `turn_tokens_floor` — so a row far past any limit is refused
        before the tokenizer (or a template render per turn) spends time on it."""
        chars = sum(len(m.get("content") or "") for m in messages)
        floor = math.ceil(chars / self.longest_token_chars)
        if chat_template:
            turns = sum(m.get("role") in ("user", "assistant") for m in messages)
            floor = max(floor, turns * self.turn_tokens_floor)
        return floor

    def _plain_ids(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    @staticmethod
    def plain_prompt(messages: Messages) -> str:
        """The prompt text of plain rows: the messages' contents, one per line."""
        return "\n".join(m["content"] for m in messages)

    def prompt_ids(self, messages: Messages, chat_template: bool) -> list[int]:
        """The ids the model sees before its answer (what a generation starts from)."""
        if chat_template:
            return self._chat_ids(messages, add_generation_prompt=True)
        return self._plain_ids(self.plain_prompt(messages))

    def prompt_completion_ids(
        self, messages: Messages, completion: str, chat_template: bool
    ) -> tuple[list[int], int]:
        """(full ids, number of prompt tokens): the completion is `full[n:]`, n the length of the
        common prefix of the prompt ids and the full ids."""
        prompt = self.prompt_ids(messages, chat_template)
        if chat_template:
            answer = {"role": "assistant", "content": completion}
            full = self._chat_ids([*messages, answer], add_generation_prompt=False)
        else:
            eos_text = self.hf.eos_token or self.hf.convert_ids_to_tokens(self.eos_id)
            if not completion.endswith(eos_text):
                completion = completion + eos_text
            full = self._plain_ids(self.plain_prompt(messages) + completion)
        return full, self._answer_start(prompt, full)

    def _answer_start(self, prompt: list[int], full: list[int]) -> int:
        """Where an answer starts in `full`: after the tokens it shares with `prompt` (warned
        once when `prompt` is not wholly a prefix of `full`)."""
        n = common_prefix_length(prompt, full)
        if n != len(prompt) and not self._warned_prefix:
            self._warned_prefix = True
            warnings.warn(
                "the prompt's token ids are not a prefix of the prompt + completion ids (the "
                "tokenizer or chat template renders the prompt differently when an answer "
                f"follows); the completion starts after the {n} tokens they share",
                PromptPrefixWarning,
                stacklevel=3,
            )
        return n

    def conversation_ids(
        self,
        messages: Messages,
        tools: Tools = None,
        last_only: bool = False,
        limit: int | None = None,
    ) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of a whole conversation through the chat template, every assistant
        turn a target (TRL's `assistant_only_loss`): turn i's tokens are those the conversation
        up to and including it adds to the conversation before it with the generation prompt
        (its content and end of turn). `last_only`: the last message alone is a target (TRL's
        prompt-completion rows, whose `completion_only_loss` leaves the prompt's assistant
        turns out). `tools` go to the template. A conversation with one assistant turn, at its
        end, gets `prompt_completion_ids`'s ids and mask. A conversation over `limit` tokens
        comes back at once with no target (the caller refuses it by its length): the masks cost
        two template renders per assistant turn."""
        full = self._chat_ids(messages, add_generation_prompt=False, tools=tools)
        mask = [0] * len(full)
        if limit is not None and len(full) > limit:
            return full, mask
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or (last_only and i + 1 < len(messages)):
                continue
            before = self._chat_ids(messages[:i], True, tools) if i else []
            start = self._answer_start(before, full)
            upto = self._chat_ids(messages[: i + 1], add_generation_prompt=False, tools=tools)
            end = common_prefix_length(upto, full) if i + 1 < len(messages) else len(full)
            mask[start:end] = [1] * (end - start)
        return full, mask


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = reading.read_text(path, "model file", MAX_CONFIG_JSON_BYTES, ModelError,
                                 "check the model directory")  # fmt: skip
        data = json.loads(text)
    except ModelError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"cannot read {path}: {exc}", "check the model directory") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object", "check the model directory")
    return data


def declared_end_ids(root: Path) -> tuple[int, ...]:
    """`eos_token_id` of generation_config.json (else config.json): an int or a list of ints."""
    for name in ("generation_config.json", "config.json"):
        path = root / name
        if not path.is_file():
            continue
        value = _read_json(path).get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        ids = tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))
        if ids:
            return ids
    return ()


def check_tokenizer_files(root: Path) -> None:
    """ModelError unless the checkpoint directory `root` holds a tokenizer file (a file check:
    the training preflight runs it before torch loads)."""
    if not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(
            f"no tokenizer files in {root} (tokenizer.json, tokenizer.model or "
            "tokenizer_config.json)",
            "save the tokenizer with the model: tokenizer.save_pretrained(DIR)",
        )


def load_tokenizer(model_dir: str | os.PathLike[str]) -> CheckpointTokenizer:
    """The tokenizer of a checkpoint directory; ModelError (one line) when it has none."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelError(f"model directory not found: {root}", "check the --model path")
    check_tokenizer_files(root)
    for name in TOKENIZER_READS:
        if os.path.lexists(root / name):
            reading.open_regular(root / name, "tokenizer file", ModelError).close()
            if (root / name).stat().st_size > MAX_TOKENIZER_FILE_BYTES:
                raise ModelError(
                    f"tokenizer file {root / name} is larger than the limit of "
                    f"{MAX_TOKENIZER_FILE_BYTES} bytes",
                    "check the tokenizer files",
                )
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        hf = AutoTokenizer.from_pretrained(root, local_files_only=True)
    except Exception as exc:  # transformers raises many types; one line is what users get
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot load the tokenizer in {root}: {first}", "check the tokenizer files"
        ) from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    return CheckpointTokenizer(hf, declared_end_ids(root), source=str(root))
