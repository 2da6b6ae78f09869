"""A request resumed from the output another replica already streamed (GenerationInput's
resumed_output_ids / resumed_text_chars) continues exactly where it stopped: the same tokens
for greedy and seeded requests, the same text with nothing sent twice, stop strings found across
the seam, max_tokens counting what was already sent."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from engine_testlib import make_engine, request, stream

from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, StoppingCriteria
from verifier_service.batching.output import OutputTracker

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


def collected(chunks) -> tuple[list[int], str, str | None, int]:
    ids = [t for c in chunks for t in c.token_ids]
    return ids, "".join(c.text for c in chunks), chunks[-1].finish_reason, \
        chunks[-1].usage.completion_tokens


def head(chunks, cut: int) -> tuple[list[int], str]:
    """What the client had of a stream after its first `cut` chunks."""
    return [t for c in chunks[:cut] for t in c.token_ids], "".join(c.text for c in chunks[:cut])


def resumed(inp, chunks, cut: int):
    """The request as a gateway resends it after the first `cut` chunks reached the client."""
    ids, text = head(chunks, cut)
    return dataclasses.replace(inp, request_id=inp.request_id + "~r1",
                               resumed_output_ids=tuple(ids), resumed_text_chars=len(text))


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0),
                                      SamplingParams(temperature=0.9, top_p=0.95, seed=7)],
                         ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [0, 3])
def test_a_resumed_request_continues_with_the_same_tokens_and_text(target_model_dir, sampling,
                                                                   k):
    async def scenario():
        engine = make_engine(target_model_dir)
        engine.start()
        try:
            inp = request(engine, "r", PROMPT, max_tokens=40, k=k, sampling=sampling,
                          ignore_eos=True)
            whole = await stream(engine, inp)
            ref = collected(whole)
            for cut in (1, len(whole) // 2, len(whole) - 1):
                first = head(whole, cut)
                rest = await stream(engine, resumed(inp, whole, cut))
                ids, text, reason, completion = collected(rest)
                assert first[0] + ids == ref[0]
                assert first[1] + text == ref[1]
                assert (reason, completion) == (ref[2], ref[3])  # usage counts all 40
            snap = engine.snapshot()
            assert snap.kv_blocks_free == snap.kv_blocks_total
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_a_stop_string_across_the_seam_and_a_finished_replay(target_model_dir):
    async def scenario():
        engine = make_engine(target_model_dir)
        engine.start()
        try:
            inp = request(engine, "s", PROMPT, max_tokens=30, ignore_eos=True)
            whole = await stream(engine, inp)
            ids, text, _, _ = collected(whole)
            stop = text[10:16]  # stopped on a 6-character string: 5 held back while streaming
            stopped = dataclasses.replace(inp, stopping=StoppingCriteria(
                max_tokens=30, stop=(stop,), ignore_eos=True))
            chunks = await stream(engine, stopped)
            ref = collected(chunks)
            assert ref[2] == "stop" and ref[1] == text[:text.index(stop)]
            for cut in range(1, len(chunks) - 1):  # every seam, some inside the stop string
                first = head(chunks, cut)
                rest = collected(await stream(engine, resumed(stopped, chunks, cut)))
                assert first[0] + rest[0] == ref[0] and first[1] + rest[1] == ref[1]
                assert rest[2:] == ref[2:]
            # output that already reached max_tokens: finished at once, nothing generated
            done = collected(await stream(engine, dataclasses.replace(
                inp, request_id="s3", resumed_output_ids=tuple(ids), resumed_text_chars=0)))
            assert done[0] == [] and done[1] == text and done[2:] == ("length", 30)
            with pytest.raises(InvalidArgument, match="resume.output_token_ids"):
                await stream(engine, dataclasses.replace(
                    inp, request_id="s4", resumed_output_ids=tuple(ids) + (1,)))
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_the_tracker_sends_only_what_the_client_does_not_have():
    class Chars:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    t = OutputTracker(Chars(), [ord("p")], StoppingCriteria(max_tokens=10, stop=("xyz",)),
                      set(), 10)
    out = t.resume([ord(c) for c in "abxy"], 2)  # "xy" held back by the first replica
    assert out.text == "" and out.finish_reason is None  # still held: could start "xyz"
    out = t.append([ord("z")])
    assert out.finish_reason == "stop" and out.text == ""
    assert t.text == "ab"
