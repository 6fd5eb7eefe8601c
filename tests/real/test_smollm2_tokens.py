"""On SmolLM2-135M-Instruct: twinrun's tokens are TRL 1.x's, with no doubled BOS anywhere, and
transformers' greedy answer to the France question is the reference for decoding.

`trl_tokenize` below is TRL's rule written out (TRL is not a dependency): `SFTTrainer` first
appends the eos token's text to a plain completion (`add_eos`, not when it already ends with it),
then tokenizes a prompt-completion row as
    conversational: prompt_ids = apply_chat_template(prompt, add_generation_prompt=True)
                    full_ids   = apply_chat_template(prompt + completion)
    plain:          prompt_ids = tokenizer(prompt)["input_ids"]
                    full_ids   = tokenizer(prompt + completion)["input_ids"]
    completion_mask = [0] * len(prompt_ids) + [1] * (len(full_ids) - len(prompt_ids))
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.real.reference import completion_loss_reference, greedy_reference
from twinrun.core.errors import DataError, ModelError
from twinrun.data.examples import (
    SourcedRow,
    encode_sft_rows,
    load_rows,
    sft_parts,
    shipped_examples,
)
from twinrun.data.pairs import encode_pairs, pair_parts
from twinrun.model.tokens import CheckpointTokenizer, PromptPrefixWarning, load_tokenizer

pytestmark = pytest.mark.real

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# apply_chat_template(FRANCE, add_generation_prompt=True): <|im_start|>system ... <|im_end|>\n
# <|im_start|>user ... <|im_end|>\n<|im_start|>assistant\n — one BOS (<|im_start|> = 1) in front.
FRANCE_IDS = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
]  # fmt: skip
PARIS_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]  # "The capital of France is Paris.<|im_end|>"


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> CheckpointTokenizer:
    return load_tokenizer(smollm2_dir)


def trl_tokenize(
    hf: Any, prompt: list[dict[str, str]] | str, completion: str, conversational: bool
) -> tuple[list[int], list[int]]:
    """(input_ids, completion_mask) of a prompt-completion row, as TRL 1.x's SFTTrainer."""
    if conversational:
        assert isinstance(prompt, list)
        answer = [{"role": "assistant", "content": completion}]
        prompt_ids = hf.apply_chat_template(
            prompt, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        full_ids = hf.apply_chat_template(prompt + answer, tokenize=True, return_dict=False)
    else:
        assert isinstance(prompt, str)
        if not completion.endswith(hf.eos_token):
            completion = completion + hf.eos_token
        prompt_ids = hf(text=prompt)["input_ids"]
        full_ids = hf(text=prompt + completion)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids, "TRL warns here; not expected in these rows"
    mask = [0] * len(prompt_ids) + [1] * (len(full_ids) - len(prompt_ids))
    return list(full_ids), mask


def no_doubled_bos(ids: tuple[int, ...] | list[int]) -> bool:
    return list(ids[:2]) != [1, 1]


def test_chat_prompt_ids_are_apply_chat_templates(tok: CheckpointTokenizer) -> None:
    want = tok.hf.apply_chat_template(FRANCE, add_generation_prompt=True, return_dict=False)
    assert tok.prompt_ids(FRANCE, chat_template=True) == want == FRANCE_IDS
    assert FRANCE_IDS[:2] == [1, 9690] and tok.bos_id == 1


def test_sft_rows_are_trls_with_the_chat_template(tok: CheckpointTokenizer) -> None:
    rows = load_rows(shipped_examples("sft.jsonl"))
    encoded = encode_sft_rows(tok, rows, chat_template=True, max_length=8192)
    assert len(encoded) == len(rows) == 64
    for row, enc in zip(rows, encoded, strict=True):
        messages, completion = sft_parts(row)
        ids, mask = trl_tokenize(tok.hf, messages, completion, conversational=True)
        assert (list(enc.input_ids), list(enc.loss_mask)) == (ids, mask), row.where
        assert no_doubled_bos(enc.input_ids)
        # the completion ends with the template's end of turn: "<|im_end|>\n"
        assert enc.input_ids[-2:] == (2, 198) and enc.loss_mask[-1] == 1


def test_sft_rows_are_trls_without_the_chat_template(tok: CheckpointTokenizer) -> None:
    rows = [r for r in load_rows(shipped_examples("sft.jsonl")) if "prompt" in r.data]
    encoded = encode_sft_rows(tok, rows, chat_template=False, max_length=8192)
    assert len(rows) >= 30
    for row, enc in zip(rows, encoded, strict=True):
        ids, mask = trl_tokenize(tok.hf, row.data["prompt"], row.data["completion"], False)
        assert (list(enc.input_ids), list(enc.loss_mask)) == (ids, mask), row.where
        assert enc.input_ids[0] != 1 and enc.input_ids[-1] == 2  # no BOS rule; eos last
    first = encoded[0]  # "What is 1 + 1?" + "2" + eos, by hand from the vocabulary
    assert tok.hf.convert_ids_to_tokens(list(first.input_ids)) == [
        "What", "Ġis", "Ġ", "1", "Ġ+", "Ġ", "1", "?", "2", "<|im_end|>",
    ]  # fmt: skip
    assert first.loss_mask == (0,) * 8 + (1, 1)


@pytest.mark.parametrize("chat", [True, False])
def test_pair_sides_are_trls(tok: CheckpointTokenizer, chat: bool) -> None:
    rows = load_rows(shipped_examples("pairs.jsonl"))
    if not chat:
        rows = [r for r in rows if "prompt" in r.data]
    pairs = encode_pairs(tok, rows, chat_template=chat, max_length=8192)
    for row, pair in zip(rows, pairs, strict=True):
        messages, chosen, rejected = pair_parts(row)
        prompt: list[dict[str, str]] | str = messages if chat else row.data["prompt"]
        for side, text in ((pair.chosen, chosen), (pair.rejected, rejected)):
            ids, mask = trl_tokenize(tok.hf, prompt, text, chat)
            assert (list(side.input_ids), list(side.loss_mask)) == (ids, mask), row.where
            assert no_doubled_bos(side.input_ids)


def test_a_pairs_sides_share_one_prompt_length(tok: CheckpointTokenizer) -> None:
    """TRL's DPOTrainer: the pair's prompt is the shorter of the sides' common prefixes with the
    prompt ids. "Say hi: " is [Say, Ġhi, :, Ġ]; "hi" merges with its final space, "42" does not
    ([Ġ, 4, 2]), so the rejected side trains that space too (ids from bench/trl_tokens.py)."""
    row = SourcedRow({"prompt": "Say hi: ", "chosen": "hi", "rejected": "42"}, "x:1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptPrefixWarning)
        (pair,) = encode_pairs(CheckpointTokenizer(tok.hf, tok.end_ids), [row], False, 8192)
    assert list(pair.chosen.input_ids) == [36218, 15876, 42, 15876, 2]
    assert list(pair.rejected.input_ids) == [36218, 15876, 42, 216, 36, 34, 2]
    assert pair.chosen.loss_mask == (0, 0, 0, 1, 1)
    assert pair.rejected.loss_mask == (0, 0, 0, 1, 1, 1, 1)


def test_prompt_only_rows_of_extract_are_generation_prompts(tok: CheckpointTokenizer) -> None:
    from twinrun.infer.extract import encode_examples

    rows = [SourcedRow({"prompt": FRANCE[0]["content"]}, "x.jsonl:1")]
    (enc,) = encode_examples(tok, rows, True, 8192)
    assert list(enc.input_ids) == FRANCE_IDS and set(enc.loss_mask) == {0}


def test_not_a_prefix_warns_once_and_the_completion_follows_the_shared_tokens(
    tok: CheckpointTokenizer,
) -> None:
    fresh = CheckpointTokenizer(tok.hf, tok.end_ids)
    user = [{"role": "user", "content": "Say hi: "}]
    # "Say hi: " is [Say, Ġhi, :, Ġ]; with "hi" after it the space merges: [Say, Ġhi, :, Ġhi, eos]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids, n = fresh.prompt_completion_ids(user, "hi", chat_template=False)
        fresh.prompt_completion_ids([{"role": "user", "content": "Hello"}], "world", False)
    assert fresh.prompt_ids(user, False) == [36218, 15876, 42, 216]
    assert (ids, n) == ([36218, 15876, 42, 15876, 2], 3)
    assert [w.category for w in caught] == [PromptPrefixWarning]
    assert "not a prefix" in str(caught[0].message)


def test_end_ids_hold_the_end_of_turn(tok: CheckpointTokenizer, tmp_path: Path) -> None:
    assert tok.end_ids == (2,) and tok.eos_id == 2 and tok.pad_id == 2
    assert tok.hf.convert_ids_to_tokens(2) == "<|im_end|>"
    assert tok.render_chat(FRANCE, False).endswith("France?<|im_end|>\n")
    # a list in generation_config.json: every id is an end id, in order, the tokenizer's eos too
    copy = tokenizer_copy(tok, tmp_path / "m")
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    assert load_tokenizer(copy).end_ids == (0, 2)
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert load_tokenizer(copy).end_ids == (0, 2)


def test_greedy_reference_answers_paris(smollm2_dir: Path, tok: CheckpointTokenizer) -> None:
    tokens = greedy_reference(smollm2_dir, FRANCE_IDS, max_new_tokens=20)
    assert tokens == PARIS_IDS
    assert tok.decode(tokens) == "The capital of France is Paris."


def test_a_row_longer_than_the_positions_is_named(tok: CheckpointTokenizer) -> None:
    rows = load_rows(shipped_examples("sft.jsonl"))
    n = len(encode_sft_rows(tok, rows[:1], True, 8192)[0].input_ids)
    with pytest.raises(DataError, match=rf"sft.jsonl:1: {n} tokens exceed the row limit of 40 "):
        encode_sft_rows(tok, rows, chat_template=True, max_length=40)


def tokenizer_copy(tok: CheckpointTokenizer, out: Path, template: bool = True) -> Path:
    out.mkdir(parents=True)
    tok.hf.save_pretrained(out)
    if not template:
        (out / "chat_template.jinja").unlink()
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def test_chat_on_without_a_template_is_one_line(tok: CheckpointTokenizer, tmp_path: Path) -> None:
    plain = load_tokenizer(tokenizer_copy(tok, tmp_path / "plain", template=False))
    assert plain.chat_template is None
    rows = load_rows(shipped_examples("sft.jsonl"))[:2]
    with pytest.raises(ModelError, match="--chat-template on, but the tokenizer") as err:
        encode_sft_rows(plain, rows, chat_template=True, max_length=8192)
    assert "\n" not in err.value.one_line()
    assert encode_sft_rows(plain, rows, chat_template=False, max_length=8192)  # off still works


def test_completion_loss_reference_scores_the_greedy_answer(
    smollm2_dir: Path, tok: CheckpointTokenizer
) -> None:
    import torch

    from tests.real.reference import reference_model

    # generate's own scores (greedy: raw logits) give the answer's log-probabilities one way ...
    model = reference_model(smollm2_dir)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([FRANCE_IDS]), attention_mask=torch.ones(1, len(FRANCE_IDS)),
            max_new_tokens=20, do_sample=False, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
    scored = zip(out.scores, PARIS_IDS, strict=True)
    steps = [torch.log_softmax(s[0].double(), -1)[t] for s, t in scored]
    want = -float(torch.stack(steps).mean())
    # ... and one forward over the row as SFT encodes it gives them the other
    ids, n = tok.prompt_completion_ids(FRANCE, "The capital of France is Paris.", True)
    assert ids[n:] == [*PARIS_IDS, 198]  # the end of turn "<|im_end|>" then "\n"
    mask = [0] * n + [1] * len(PARIS_IDS) + [0]
    got = completion_loss_reference(smollm2_dir, ids, mask)
    assert got == pytest.approx(want, rel=1e-4) and got < 0.5
    wrong, m = tok.prompt_completion_ids(FRANCE, "The capital of France is Lyon.", True)
    assert completion_loss_reference(smollm2_dir, wrong, [0] * m + [1] * (len(wrong) - m)) > got


def test_every_assistant_turn_of_a_multi_turn_row_is_a_target(tok: CheckpointTokenizer) -> None:
    """TRL's `assistant_only_loss` on a two-turn conversation: each answer's tokens and its end
    of turn are targets ("4.<|im_end|>\\n" = 36 30 2 198, "6.<|im_end|>\\n" = 38 30 2 198),
    nothing else; the ids are the template's rendering of the whole conversation."""
    conversation = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6."},
    ]
    (enc,) = encode_sft_rows(tok, [SourcedRow({"messages": conversation}, "x:1")], True, 8192)
    ids = list(enc.input_ids)
    assert ids == tok.hf.apply_chat_template(conversation, tokenize=True, return_dict=False)
    first = tok.hf.apply_chat_template(
        conversation[:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert len(first) == 37 and ids[:37] == list(first)
    targets = [i for i, bit in enumerate(enc.loss_mask) if bit]
    assert targets == [37, 38, 39, 40, 56, 57, 58, 59] and len(ids) == 60
    assert [ids[i] for i in targets] == [36, 30, 2, 198, 38, 30, 2, 198]
