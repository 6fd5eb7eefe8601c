"""Secret redaction (docs/capture.md, "Secrets") for anything persisted or hashed.

Replaced by "<redacted>":
- the value of any key that looks secret at any depth: `api_key`, `token`, `password`,
  `secret`, `authorization`, `*_token`, `*_key`, `credential*` (case-insensitive, `-` = `_`);
- URL userinfo (`https://user:pass@host` -> `https://<redacted>@host`) in any string;
- secret-named query parameters in URLs (`?token=...&x=1` -> `?token=<redacted>&x=1`);
- every value of free-form environment args (`environment.args` / `--env-arg`), keys kept.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"
_SECRET_KEY = re.compile(
    r"^(api_?key|token|password|passwd|secret|authorization|.*_token|.*_key|credentials?.*"
    r"|.*_secret|.*_password|access_token|auth)$",
    re.IGNORECASE,
)
# A key stops at the next separator (`?` included), so the scans of two matches never overlap
# and the pattern runs in linear time ("?" * n was quadratic when a key could hold a `?`).
_QUERY = re.compile(r"(?P<sep>[?&;])(?P<key>[^=&;#?\s]+)=(?P<value>[^&;#\s]*)")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_USERINFO_END = re.compile(r"[/@\s]")
_MAX_SCHEME = 64  # how far back from a ':' a scheme is looked for


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.match(key.replace("-", "_")))


def _redact_userinfo(text: str) -> str:
    """`scheme://user:pass@` -> `scheme://<redacted>@` (`scheme:/` too), in linear time: each
    `:/` is looked at once, the userinfo after it is scanned up to the next `/`, `@` or space
    (so two scans never overlap), and the scheme before it at most _MAX_SCHEME characters."""
    if "@" not in text or ":/" not in text:
        return text
    parts: list[str] = []
    done = 0  # text[:done] is in parts
    at = text.find(":/")
    while at != -1:
        start = at + 3 if text.startswith("//", at + 1) else at + 2
        end = _USERINFO_END.search(text, start)
        stop = end.start() if end else len(text)
        back = at
        while back > max(done, at - _MAX_SCHEME) and text[back - 1] in _SCHEME_CHARS:
            back -= 1
        has_scheme = any(c.isascii() and c.isalpha() for c in text[back:at])
        if end and text[stop] == "@" and stop > start and has_scheme:
            parts.append(text[done:start])
            parts.append(REDACTED)
            done = stop
        at = text.find(":/", max(stop - 1, at + 1))  # `x:/` may end the userinfo scanned
    parts.append(text[done:])
    return "".join(parts)


def redact_string(text: str) -> str:
    text = _redact_userinfo(text)

    def query(m: re.Match[str]) -> str:
        if is_secret_key(m["key"]):
            return f"{m['sep']}{m['key']}={REDACTED}"
        return m[0]

    return _QUERY.sub(query, text) if "://" in text or "?" in text else text


def redact(obj: Any) -> Any:
    """A redacted deep copy of a JSON-like value."""
    if isinstance(obj, dict):
        return {
            k: REDACTED if isinstance(k, str) and is_secret_key(k) else redact(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_string(obj)
    return obj


def redact_env_args(args: dict[str, Any] | None) -> dict[str, str] | None:
    """Free-form environment args: keys kept, every value replaced."""
    if args is None:
        return None
    return {k: REDACTED for k in args}


_ENV_ARG_FLAGS = frozenset({"--env-arg"})


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line as it may be printed: URL userinfo and secret query values redacted in
    every word; the value after (or `=`-joined to) a secret-named flag (`--token X`,
    `--api-key=X`) and every `--env-arg key=value` value replaced; `key=value` words with a
    secret-named key too."""
    out: list[str] = []
    hide_next: str | None = None
    for word in argv:
        if hide_next is not None:
            out.append(_redact_assignment(word) if hide_next == "env" else REDACTED)
            hide_next = None
            continue
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if name in _ENV_ARG_FLAGS:
                out.append(f"{name}={_redact_assignment(value)}" if eq else word)
                hide_next = None if eq else "env"
                continue
            if is_secret_key(name[2:]):
                out.append(f"{name}={REDACTED}" if eq else word)
                hide_next = None if eq else "secret"
                continue
        out.append(_redact_word(word))
    return out


def _redact_assignment(word: str) -> str:
    key, eq, _ = word.partition("=")
    return f"{key}={REDACTED}" if eq else REDACTED


def _redact_word(word: str) -> str:
    key, eq, _ = word.partition("=")
    if eq and "://" not in key and is_secret_key(key.lstrip("-")):
        return f"{key}={REDACTED}"
    return redact_string(word)
