"""Secret redaction: keys at any depth, URL userinfo, secret query parameters."""

from __future__ import annotations

from twinrun.core.redact import REDACTED, redact, redact_env_args


def test_secret_keys_at_any_depth() -> None:
    cfg = {
        "api_key": "sk-1", "nested": {"HF_TOKEN": "hf_x", "list": [{"password": "p"}]},
        "auth-token": "t", "credentials_file": "/c", "client_secret": "s", "seed": 3,
        "tokenizer": "keep", "keys": "keep",
    }  # fmt: skip
    out = redact(cfg)
    assert out["api_key"] == REDACTED
    assert out["nested"]["HF_TOKEN"] == REDACTED
    assert out["nested"]["list"][0]["password"] == REDACTED
    assert out["auth-token"] == REDACTED and out["credentials_file"] == REDACTED
    assert out["client_secret"] == REDACTED
    assert out["seed"] == 3 and out["tokenizer"] == "keep" and out["keys"] == "keep"
    assert cfg["api_key"] == "sk-1"  # a copy: the input is untouched


def test_urls() -> None:
    url = "https://alice:hunter2@example.org/x?token=abc&page=2&api_key=k"
    out = redact({"endpoint": url})["endpoint"]
    assert "hunter2" not in out and "alice" not in out and "abc" not in out and "=k" not in out
    assert out == f"https://{REDACTED}@example.org/x?token={REDACTED}&page=2&api_key={REDACTED}"
    assert redact("plain text? no=url") == "plain text? no=url"


def test_env_args_values_all_redacted() -> None:
    assert redact_env_args({"level": 3, "url": "x"}) == {"level": REDACTED, "url": REDACTED}
    assert redact_env_args(None) is None
