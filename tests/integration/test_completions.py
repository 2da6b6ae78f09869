"""The walking skeleton through three real processes: REST and gRPC front doors, lossless
speculation, usage reporting, streaming, and bad-input handling."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from testdata import PROMPTS

from protos import common_pb2, generation_pb2_grpc
from splitspec.methods import METHODS, components_of

pytestmark = pytest.mark.integration

# what the default stack serves: every registered method that needs no model
MODEL_FREE = [m for m, spec in METHODS.items() if not spec.capabilities.needs_model]
# of those, the ones that draft for any prompt (the grammar drafts for structured requests only:
# tests/integration/test_structured_surface.py)
DRAFTS_FREE_TEXT = [m for m in MODEL_FREE if not METHODS[m].capabilities.structured_only]


@pytest.fixture(scope="module")
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=60) as c:
        yield c


def complete(client, prompt, **body):
    r = client.post("/v1/completions", json={"prompt": prompt, **body})
    assert r.status_code == 200, r.text
    return r.json()


def greedy(client, prompt, spec, max_tokens=32):
    return complete(client, prompt, max_tokens=max_tokens, temperature=0, speculation=spec)


@pytest.fixture(scope="module")
def baseline(client):
    return {p: greedy(client, p, {"mode": "off"}) for p in PROMPTS}


@pytest.mark.parametrize("method", DRAFTS_FREE_TEXT)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_is_identical_with_speculation_on_and_off(client, baseline, method, k):
    accepted = 0
    for p in PROMPTS:
        on = greedy(client, p, {"mode": "on", "method": method, "num_speculative_tokens": k})
        assert on["choices"][0]["text"] == baseline[p]["choices"][0]["text"], p
        assert on["usage"]["completion_tokens"] == baseline[p]["usage"]["completion_tokens"]
        spec = on["usage"]["speculation"]
        assert spec["method"] == method and spec["num_speculative_tokens"] == k
        assert 0 <= spec["accepted_tokens"] <= spec["proposed_tokens"]
        accepted += spec["accepted_tokens"]
        off = baseline[p]["usage"]["speculation"]
        assert off["method"] is None and off["proposed_tokens"] == 0
        assert spec["num_branches"] == off["num_branches"] == 1  # chains
    assert accepted > 0


def test_a_repetitive_prompt_gets_drafts_accepted(client):
    prompt = "alpha beta gamma delta " * 12
    out = greedy(client, prompt, {"mode": "on", "num_speculative_tokens": 4}, max_tokens=48)
    spec = out["usage"]["speculation"]
    assert spec["proposed_tokens"] > 0 and spec["accepted_tokens"] > 0
    # Accepted drafts save steps: fewer steps than tokens.
    assert spec["steps"] < out["usage"]["completion_tokens"]


def test_auto_and_on_without_a_method_or_k_let_the_policy_choose(client):
    """docs/api.md, docs/policy.md: `auto` (the default) picks a served method and k, or off,
    and says why; `on` without k takes its method (none: the first served, n-gram) with a
    policy-chosen k >= 1 and drafts every step; `on` with a k is honoured exactly."""
    prompt = "alpha beta gamma delta " * 8
    for body in ({}, {"speculation": {"mode": "auto"}}):
        spec = complete(client, prompt, max_tokens=16, temperature=0, **body)["usage"][
            "speculation"]
        assert spec["mode"] == "auto", body
        if spec["method"] is None:
            assert spec["num_speculative_tokens"] == 0 and spec["proposed_tokens"] == 0
            assert spec["policy_reason"] in {"low_acceptance", "compute_bound",
                                             "unmeasured_batch"}, spec
        else:
            # a served method, or a hybrid of them (cold: the gated retrieval chain)
            assert all(m in MODEL_FREE for m in components_of(spec["method"])), spec
            assert 1 <= spec["num_speculative_tokens"] <= 8
            assert spec["policy_reason"] in {"goodput", "exploration"}, spec
    for body in ({"mode": "on"}, {"mode": "on", "method": "suffix"}):
        spec = complete(client, prompt, max_tokens=16, temperature=0, speculation=body)[
            "usage"]["speculation"]
        assert (spec["mode"], spec["policy_reason"]) == ("on", "requested_on")
        assert spec["method"] == body.get("method", "ngram")
        assert 1 <= spec["num_speculative_tokens"] <= 8
        assert spec["proposed_tokens"] > 0, body
    spec = complete(client, prompt, max_tokens=16, temperature=0, speculation={
        "mode": "on", "method": "ngram", "num_speculative_tokens": 7})["usage"]["speculation"]
    assert (spec["method"], spec["num_speculative_tokens"]) == ("ngram", 7)  # exactly that


def test_streaming_delivers_the_same_text_as_non_streaming(client, baseline):
    for p in PROMPTS[:4]:
        text, finish, usage, done = "", None, None, False
        with client.stream("POST", "/v1/completions", json={
                "prompt": p, "max_tokens": 32, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True},
                "speculation": {"mode": "on", "num_speculative_tokens": 3}}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if not line:
                    continue
                assert line.startswith("data: ")
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if chunk["choices"]:
                    text += chunk["choices"][0]["text"]
                    finish = chunk["choices"][0]["finish_reason"] or finish
                if chunk.get("usage"):
                    usage = chunk["usage"]
        assert done and text == baseline[p]["choices"][0]["text"] and finish == "length"
        assert usage["completion_tokens"] == 32 and usage["speculation"]["method"] == "ngram"


def test_the_official_openai_client_completes_a_prompt(stack, baseline):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)
    model = oa.models.list().data[0].id
    out = oa.completions.create(model=model, prompt=PROMPTS[0], max_tokens=32, temperature=0,
                                extra_body={"speculation": {"mode": "on", "method": "ngram",
                                                            "num_speculative_tokens": 3}})
    assert out.choices[0].text == baseline[PROMPTS[0]]["choices"][0]["text"]
    assert out.usage.completion_tokens == 32
    assert out.usage.model_extra["speculation"]["method"] == "ngram"
    stream = oa.completions.create(model=model, prompt=PROMPTS[0], max_tokens=32, temperature=0,
                                   stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == \
        baseline[PROMPTS[0]]["choices"][0]["text"]
    with pytest.raises(openai.BadRequestError):
        oa.completions.create(model=model, prompt="x", max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        oa.completions.create(model="no-such-model", prompt="x")


@pytest.mark.parametrize("body, field", [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "speculation": {"mode": "on", "method": "medusa"}}, "speculation.method"),
    ({"prompt": "x", "speculation": {"mode": "on", "method": "draft"}}, "speculation.method"),
    ({"prompt": "x", "speculation": {"mode": "on", "method": "hybrid:ngram+medusa"}},
     "speculation.method"),
    ({"prompt": "x", "speculation": {"mode": "on", "method": "hybrid:ngram+lookahead"}},
     "speculation.method"),
    ({"prompt": "x", "speculation": {"mode": "on", "method": "hybrid:ngram+draft"}},
     "speculation.method"),  # a component this stack does not serve
    ({"prompt": "x", "speculation": {"mode": "on", "method": "hybrid:draft|ngram"}},
     "speculation.method"),  # a sampled drafter cannot gate a later tier
    ({"prompt": "x", "speculation": {"mode": "on", "num_speculative_tokens": 99}},
     "speculation.num_speculative_tokens"),
    ({"prompt": "x", "max_tokens": 10**7}, "max_tokens"),
])
def test_bad_requests_get_400_naming_the_field_and_the_gateway_keeps_serving(client, body,
                                                                             field):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["message"].startswith(f"{field}: ")
    assert err["type"] == "invalid_request_error"
    ok = complete(client, PROMPTS[1], max_tokens=4, temperature=0)
    assert ok["usage"]["completion_tokens"] == 4


def test_malformed_json_is_a_400(client):
    r = client.post("/v1/completions", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_models_and_health(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["speculation_methods"] == MODEL_FREE
    assert client.get("/health").json() == {"status": "ok"}


def test_batch_of_prompts_returns_one_choice_each(client, baseline):
    out = complete(client, PROMPTS[:3], max_tokens=32, temperature=0)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for c, p in zip(out["choices"], PROMPTS[:3]):
        assert c["text"] == baseline[p]["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == 96


def test_grpc_generation_service_streams_the_same_text(stack, baseline):
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        req = common_pb2.GenerateRequest(
            text=PROMPTS[2], sampling=common_pb2.SamplingParams(temperature=0),
            stopping=common_pb2.StoppingCriteria(max_tokens=32),
            speculation=common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                                     num_speculative_tokens=5))
        chunks = list(stub.Generate(req, timeout=60))
        assert "".join(c.text for c in chunks) == baseline[PROMPTS[2]]["choices"][0]["text"]
        last = chunks[-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert last.usage.completion_tokens == 32 and last.usage.speculation.method == "ngram"
        bad = common_pb2.GenerateRequest(text="x",
                                         stopping=common_pb2.StoppingCriteria(max_tokens=10**7))
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(bad, timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("max_tokens: ")  # the field first
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(common_pb2.GenerateRequest(), timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("prompt: ")
        models = stub.ListModels(common_pb2.Empty(), timeout=10)
        assert models.models[0].speculation_methods == MODEL_FREE


@pytest.mark.parametrize("method", ["ngram", "suffix", "hybrid:suffix+ngram",
                                    "hybrid:suffix|ngram"])
def test_token_trees_are_lossless_through_the_services(client, baseline, method):
    proposed = 0
    for p in PROMPTS:
        on = greedy(client, p, {"mode": "on", "method": method, "num_speculative_tokens": 6,
                                "num_branches": 3})
        assert on["choices"][0]["text"] == baseline[p]["choices"][0]["text"], p
        spec = on["usage"]["speculation"]
        assert 0 <= spec["branch_hits"] <= spec["steps"] and spec["num_branches"] == 3
        proposed += spec["proposed_tokens"]
    assert proposed > 0


@pytest.mark.parametrize("branches", [0, 99, "3"])
def test_bad_num_branches_is_a_400_naming_the_field(client, branches):
    r = client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 4,
        "speculation": {"mode": "on", "method": "ngram", "num_branches": branches}})
    assert r.status_code == 400, r.text
    assert "speculation.num_branches" in r.text


LOOKAHEAD_SHAPE = {"window": 2, "ngram": 4, "guesses": 3}


def test_lookahead_with_its_own_shape_is_lossless_through_rest_and_grpc(stack, client, baseline):
    spec = {"mode": "on", "method": "lookahead", "num_speculative_tokens": 8,
            "lookahead": LOOKAHEAD_SHAPE}
    for p in PROMPTS:
        on = greedy(client, p, spec)
        assert on["choices"][0]["text"] == baseline[p]["choices"][0]["text"], p
        assert on["usage"]["speculation"]["method"] == "lookahead"
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        speculation = common_pb2.SpeculationConfig(
            mode=common_pb2.SPECULATION_MODE_ON, method="lookahead", num_speculative_tokens=8,
            lookahead=common_pb2.LookaheadConfig(**LOOKAHEAD_SHAPE))
        req = common_pb2.GenerateRequest(
            text=PROMPTS[1], sampling=common_pb2.SamplingParams(temperature=0),
            stopping=common_pb2.StoppingCriteria(max_tokens=32), speculation=speculation)
        text = "".join(c.text for c in stub.Generate(req, timeout=60))
        assert text == baseline[PROMPTS[1]]["choices"][0]["text"]
        req.speculation.lookahead.ngram = 9
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(req, timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("speculation.lookahead.ngram: ")


@pytest.mark.parametrize("method, lookahead, field", [
    ("lookahead", {"window": 0}, "speculation.lookahead.window"),
    ("lookahead", {"window": 17}, "speculation.lookahead.window"),
    ("lookahead", {"ngram": 1}, "speculation.lookahead.ngram"),
    ("lookahead", {"guesses": -1}, "speculation.lookahead.guesses"),
    ("lookahead", {"guesses": "2"}, "speculation.lookahead.guesses"),
    ("lookahead", {"depth": 2}, "speculation.lookahead.depth"),
    ("lookahead", [3, 3, 2], "speculation.lookahead"),
    ("ngram", {"window": 3}, "speculation.lookahead"),
    # within the API's bounds, beyond this verifier's node limit (8): only it can tell
    ("lookahead", {"window": 16, "ngram": 3}, "speculation.lookahead.window"),
])
def test_bad_lookahead_shapes_are_a_400_naming_the_field(client, method, lookahead, field):
    r = client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 4,
        "speculation": {"mode": "on", "method": method, "lookahead": lookahead}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text
