"""Prompt encoding in the verifier: text and chat messages to token ids off the event loop,
the tokenizer's own chat template when it has one, the default otherwise, and prompts too long
for the context refused before tokenizing."""

from __future__ import annotations

import asyncio

import pytest

from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.modelio import load_tokenizer
from verifier_service.prompt import DEFAULT_CHAT_TEMPLATE, PromptEncoder


@pytest.fixture(scope="module")
def tokenizer(target_model_dir):
    return load_tokenizer(target_model_dir, False)


def chat(*turns, **kw) -> common_pb2.GenerateRequest:
    return common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(messages=[
        common_pb2.ChatMessage(role=r, content=c) for r, c in turns]), **kw)


def encode(encoder, req):
    return asyncio.run(encoder.encode(req))


def test_messages_use_the_default_template_when_the_tokenizer_has_none(tokenizer):
    assert not tokenizer.chat_template  # the shipped model has none
    enc = PromptEncoder(tokenizer, 512)
    ids = encode(enc, chat(("system", "S"), ("user", "hi")))
    assert ids == tokenizer.encode("system: S\n\nuser: hi\n\nassistant:",
                                   add_special_tokens=False)
    assert enc.chat_template == DEFAULT_CHAT_TEMPLATE


def test_the_tokenizers_own_template_wins(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "chat_template",
                        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}", raising=False)
    ids = encode(PromptEncoder(tokenizer, 512), chat(("user", "hi")))
    assert ids == tokenizer.encode("<user>hi<assistant>", add_special_tokens=False)


@pytest.mark.parametrize("req, field", [
    (common_pb2.GenerateRequest(text="x" * (512 * 32 + 1)), "prompt"),
    (chat(("user", "x" * (512 * 32 + 1))), "messages"),
    (chat(("tool", "x")), "messages[0].role"),
    (chat(("user", "x"), text="y"), "messages"),
    (common_pb2.GenerateRequest(token_ids=common_pb2.TokenIds(ids=[1, -1])), "prompt"),
    (common_pb2.GenerateRequest(), "prompt"),
])
def test_refusals_name_the_field(tokenizer, req, field):
    with pytest.raises(InvalidArgument) as e:
        encode(PromptEncoder(tokenizer, 512), req)
    assert e.value.field == field
