"""Tokenizer loading without transformers (startup speed).

`load_tokenizer(model_dir)` reads `tokenizer.json` with `tokenizers.Tokenizer.from_file`, the
special tokens from `tokenizer_config.json` (falling back to `config.json` ids) and the chat
template from `tokenizer_config.json` or `chat_template.jinja` (transformers 5 writes the latter).
`encode` adds no special tokens; `render_chat` renders the template with jinja2 the way
transformers' `apply_chat_template(tokenize=False)` does (sandboxed, trim_blocks, lstrip_blocks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twinrun.core.errors import ModelError


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}", "check the model directory") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object", "check the model directory")
    return data


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _pick_template(value: Any) -> str | None:
    """`chat_template` is a string, or a list of {"name", "template"} (take "default")."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


class ByteTokenizer:
    """A thin wrapper over a `tokenizers.Tokenizer` plus special ids and a chat template."""

    def __init__(
        self,
        tokenizer: Any,
        bos_id: int | None,
        eos_id: int | None,
        pad_id: int | None,
        chat_template: str | None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self._compiled: Any = None

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no special tokens are added (special-token text is recognised)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special))

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The chat template rendered to text (what `apply_chat_template(tokenize=False)` gives)."""
        if self.chat_template is None:
            raise ModelError(
                "the tokenizer has no chat template",
                "use --chat-template off, or a model whose tokenizer_config.json has one",
            )
        if self._compiled is None:
            self._compiled = _compile(self.chat_template)
        return str(
            self._compiled.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        )


def _compile(template: str) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateError as exc:
        raise ModelError(f"the chat template does not compile: {exc}", "fix the template") from exc


def load_tokenizer(model_dir: str | os.PathLike[str]) -> ByteTokenizer:
    """Load `tokenizer.json` (+ config) from a checkpoint directory. ModelError when missing."""
    from tokenizers import Tokenizer

    root = Path(model_dir)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise ModelError(
            f"no tokenizer.json in {root}",
            "point --model at a Hugging Face checkpoint with a fast tokenizer",
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ModelError(f"cannot load {path}: {exc}", "check the tokenizer files") from exc
    cfg_path = root / "tokenizer_config.json"
    cfg = _read_json(cfg_path) if cfg_path.is_file() else {}
    model_cfg_path = root / "config.json"
    model_cfg = _read_json(model_cfg_path) if model_cfg_path.is_file() else {}

    special: dict[str, str] = {}
    ids: dict[str, int | None] = {}
    for name in ("bos", "eos", "pad", "unk"):
        text = _token_text(cfg.get(f"{name}_token"))
        token_id = tok.token_to_id(text) if text is not None else None
        if token_id is None:
            fallback = model_cfg.get(f"{name}_token_id")
            token_id = fallback if isinstance(fallback, int) else None
            if token_id is not None and text is None:
                text = tok.id_to_token(token_id)
        ids[name] = token_id
        if text is not None:
            special[f"{name}_token"] = text

    template = _pick_template(cfg.get("chat_template"))
    jinja_path = root / "chat_template.jinja"
    if template is None and jinja_path.is_file():
        template = jinja_path.read_text(encoding="utf-8")
    return ByteTokenizer(tok, ids["bos"], ids["eos"], ids["pad"], template, special)
