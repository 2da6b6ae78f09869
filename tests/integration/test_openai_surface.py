"""The OpenAI surface through the real processes and the official `openai` client: chat and
completions, streaming and not, logprobs (equal with speculation on and off), n > 1 with
per-choice seeds, `extra_body` speculation, every sampling field (penalties, logit bias and the
extensions), prefix caching's cached_tokens per cache_salt, /ready and /openapi.json."""

from __future__ import annotations

import grpc
import httpx
import pytest
from testdata import PROMPTS

from gateway.openai_api import MAX_N
from protos import common_pb2, generation_pb2_grpc

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")

SPEC_ON = {"mode": "on", "method": "ngram", "num_speculative_tokens": 4}
SPEC_OFF = {"mode": "off"}
REPETITIVE = "alpha beta gamma delta " * 6
CHAT = [{"role": "system", "content": "You write Python."},
        {"role": "user", "content": "def add(a, b):\n    return a + b\n\ndef add("}]


@pytest.fixture(scope="module")
def oa(stack):
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def model(oa):
    return oa.models.list().data[0].id


def test_chat_completion_streamed_and_not_gives_the_same_reply(oa, model):
    out = oa.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0,
                                     extra_body={"speculation": SPEC_ON})
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and out.usage.completion_tokens == 24
    assert out.usage.model_extra["speculation"]["method"] == "ngram"
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    chunks = list(oa.chat.completions.create(
        model=model, messages=CHAT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"speculation": SPEC_OFF}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # speculation on (above) and off: the same text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == 24
    assert usage.prompt_tokens == out.usage.prompt_tokens
    assert usage.model_extra["speculation"]["method"] is None


def test_chat_renders_the_default_template_documented_in_the_api_docs(oa, model):
    """docs/api.md: without a template of its own, "role: content" turns then "assistant:";
    the same text sent as a completion prompt gives the same greedy reply."""
    chat = oa.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=0)
    prompt = "".join(f"{m['role']}: {m['content']}\n\n" for m in CHAT) + "assistant:"
    plain = oa.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_repeated_prompt_reports_cached_tokens_within_its_salt(oa, model):
    """What a user sees of prefix caching: the same long prompt again has most of its tokens in
    usage.prompt_tokens_details.cached_tokens, with the same greedy reply; under another
    cache_salt nothing is shared."""
    prompt = "A long system prompt shared by many requests. " * 8 + "Question: what is 2 + 2?"

    def ask(salt: str):
        return oa.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                     extra_body={"cache_salt": salt})

    first, again, other = ask("surface-a"), ask("surface-a"), ask("surface-b")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens // 2
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert first.choices[0].text == again.choices[0].text == other.choices[0].text


def _completion_logprobs(oa, model, spec):
    return oa.completions.create(model=model, prompt=REPETITIVE, max_tokens=20, temperature=0,
                                 logprobs=3, extra_body={"speculation": spec})


def test_completion_logprobs_are_equal_with_speculation_on_and_off(oa, model):
    on, off = (_completion_logprobs(oa, model, s) for s in (SPEC_ON, SPEC_OFF))
    assert on.usage.model_extra["speculation"]["accepted_tokens"] > 0  # drafts were verified
    lp_on, lp_off = on.choices[0].logprobs, off.choices[0].logprobs
    assert on.choices[0].text == off.choices[0].text
    assert lp_on.tokens == lp_off.tokens and len(lp_on.tokens) == 20
    assert "".join(lp_on.tokens) == on.choices[0].text
    assert lp_on.token_logprobs == pytest.approx(lp_off.token_logprobs, abs=1e-4)
    for top_on, top_off, lp in zip(lp_on.top_logprobs, lp_off.top_logprobs,
                                   lp_on.token_logprobs):
        assert len(top_on) == 3 and top_on.keys() == top_off.keys()
        assert list(top_on.values()) == pytest.approx(list(top_off.values()), abs=1e-4)
        # greedy: the emitted token is the most likely one, reported at temperature 1
        assert lp == pytest.approx(max(top_on.values()), abs=1e-6) and lp < 0
    assert lp_on.text_offset[0] == 0


def test_streamed_chat_logprobs_match_the_non_streamed_ones(oa, model):
    full = oa.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0,
                                      logprobs=True, top_logprobs=2,
                                      extra_body={"speculation": SPEC_ON})
    content = full.choices[0].logprobs.content
    assert len(content) == 16 and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == full.choices[0].message.content
    assert all(t.bytes == list(t.token.encode()) for t in content)
    streamed = [t for c in oa.chat.completions.create(
        model=model, messages=CHAT, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2,
        stream=True, extra_body={"speculation": SPEC_OFF})
        if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content],
                                                          abs=1e-4)


def test_sampled_logprobs_follow_the_sampling_parameters(oa, model):
    """top_k = 2 at temperature 0.7: two alternatives carry all the mass; the emitted token is
    one of them, with the log-probability the alternatives give it."""
    out = oa.completions.create(model=model, prompt=PROMPTS[0], max_tokens=8, temperature=0.7,
                                seed=7, logprobs=3, extra_body={"top_k": 2})
    lp = out.choices[0].logprobs
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        kept = sorted(top.values(), reverse=True)
        assert kept[2] == -9999.0  # outside top-k: probability 0
        assert sum(2.718281828 ** v for v in kept[:2]) == pytest.approx(1.0, abs=1e-4)
        assert top[token] == pytest.approx(value, abs=1e-6)


def test_n_choices_are_independent_and_seeded_per_choice(oa, model):
    kw = dict(model=model, prompt=PROMPTS[4], max_tokens=12, temperature=1.0)
    out = oa.completions.create(n=3, seed=11, **kw)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.text for c in out.choices]
    assert len(set(texts)) > 1  # independent samples
    # docs/api.md: choice i draws with seed + i, so each is reproducible on its own
    for i, text in enumerate(texts):
        assert oa.completions.create(n=1, seed=11 + i, **kw).choices[0].text == text
    assert out.usage.completion_tokens == 36
    single = oa.completions.create(n=1, seed=11, **kw)
    assert out.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counted once
    two = oa.completions.create(model=model, prompt=PROMPTS[:2], n=2, max_tokens=4,
                                temperature=0)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]
    assert two.choices[0].text == two.choices[1].text  # greedy: choices of a prompt agree
    chat = oa.chat.completions.create(model=model, messages=CHAT, n=2, seed=3, max_tokens=6,
                                      stream=True)
    assert {c.choices[0].index for c in chat if c.choices} == {0, 1}
    with pytest.raises(openai.BadRequestError):
        oa.completions.create(n=MAX_N + 1, **kw)


def test_errors_before_the_first_token_are_the_status_of_a_streamed_request(oa, model):
    too_long = "x " * 400  # the shipped model's context is 512 tokens
    with pytest.raises(openai.BadRequestError) as e:
        list(oa.completions.create(model=model, prompt=too_long, max_tokens=200, stream=True))
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        list(oa.chat.completions.create(model=model, messages=CHAT, max_tokens=4, stream=True,
                                        extra_body={"speculation": {"method": "medusa"}}))
    assert e.value.body["param"] == "speculation.method"


def test_extra_body_shapes_lookahead(oa, model):
    """speculation.lookahead through the official client: the reply equals speculation off's;
    a bad field is a 400 naming it."""
    kw = dict(model=model, messages=CHAT, max_tokens=24, temperature=0)
    off = oa.chat.completions.create(**kw, extra_body={"speculation": SPEC_OFF})
    shape = {"window": 2, "ngram": 3, "guesses": 2}
    on = oa.chat.completions.create(**kw, extra_body={"speculation": {
        "mode": "on", "method": "lookahead", "num_speculative_tokens": 6, "lookahead": shape}})
    assert on.choices[0].message.content == off.choices[0].message.content
    assert on.usage.model_extra["speculation"]["method"] == "lookahead"
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(**kw, extra_body={"speculation": {
            "method": "lookahead", "lookahead": {**shape, "window": 0}}})
    assert e.value.body["param"] == "speculation.lookahead.window"


def _vocab_size(stack) -> int:
    from protos import verifier_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{stack.verifier.port}") as ch:
        return verifier_pb2_grpc.VerifierStub(ch).Info(common_pb2.Empty(), timeout=30).vocab_size


def test_every_sampling_field_through_the_openai_client(stack, oa, model):
    """Penalties and logit_bias are the client's own parameters; min_tokens, bad_words,
    repetition_penalty and allowed_token_ids go in extra_body (vLLM's names). With
    min_tokens = max_tokens no reply ends early, and under every processor the greedy reply is
    the same with speculation on and off."""
    vocab = _vocab_size(stack)
    sampling = dict(max_tokens=10, temperature=0, presence_penalty=0.4, frequency_penalty=0.2,
                    logit_bias={"5": 3, "7": -100})
    extra = {"min_tokens": 10, "repetition_penalty": 1.2, "bad_words": ["gamma"],
             "allowed_token_ids": list(range(0, vocab, 2)) + [5]}
    texts = []
    for spec in (SPEC_ON, SPEC_OFF):
        out = oa.completions.create(model=model, prompt=REPETITIVE, **sampling,
                                    extra_body={**extra, "speculation": spec})
        assert out.usage.completion_tokens == 10
        if spec is SPEC_ON:  # drafts were verified under the processors
            assert out.usage.model_extra["speculation"]["proposed_tokens"] > 0
        texts.append(out.choices[0].text)
    assert texts[0] == texts[1]
    chat = oa.chat.completions.create(model=model, messages=CHAT, **sampling,
                                      extra_body={**extra, "speculation": SPEC_ON})
    assert chat.usage.completion_tokens == 10 and chat.choices[0].finish_reason == "length"


def test_ready_and_the_openapi_document(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        assert client.get("/ready").json() == {"status": "ready"}
        doc = client.get("/openapi.json").json()
        assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready",
                "/openapi.json"} <= set(doc["paths"])
        # the served document states the sampling fields' ranges (tests/gateway has the rest)
        penalty = doc["components"]["schemas"]["CompletionBody"]["properties"]["presence_penalty"]
        assert {"type": "number", "minimum": -2.0, "maximum": 2.0}.items() <= \
            penalty["anyOf"][0].items()
        r = client.delete("/v1/completions")
        assert r.status_code == 405 and r.json()["error"]["param"] == "method"


def test_grpc_generate_takes_chat_messages_and_reports_logprobs(stack, oa, model):
    """The public gRPC door: the same messages and logprobs as REST chat, the same numbers."""
    rest = oa.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                      logprobs=True, top_logprobs=2)
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        chunks = list(generation_pb2_grpc.GenerationStub(ch).Generate(
            common_pb2.GenerateRequest(
                sampling=common_pb2.SamplingParams(temperature=0),
                stopping=common_pb2.StoppingCriteria(max_tokens=8),
                options=common_pb2.GenerateOptions(top_logprobs=2, messages=[
                    common_pb2.ChatMessage(role=m["role"], content=m["content"])
                    for m in CHAT])), timeout=60))
    entries = [e for c in chunks for e in c.logprobs]
    assert [e.token_id for e in entries] == [t for c in chunks for t in c.token_ids]
    assert "".join(c.text for c in chunks) == rest.choices[0].message.content
    # float32 sums differ in their last bits with the batch a step ran in (the stack is
    # shared: another test's request may share a step), hence a tolerance above 1e-6
    assert [e.logprob for e in entries] == pytest.approx(
        [t.logprob for t in rest.choices[0].logprobs.content], abs=1e-4)
    assert all(len(e.top) == 2 for e in entries)
