"""The locust user bench/load.py runs (`locust -f bench/load_locustfile.py --headless ...`): each
task streams one chat completion from an OpenAI-compatible endpoint and records its time to
the first token, its end and its output tokens. It needs only locust, the standard library and
its sibling bench/load_stream.py, so it runs in whatever environment has locust.

Read from the environment:
  LOAD_PROMPTS     a JSON file: a list of message lists, taken in turn
  LOAD_REQUESTS    how many requests the run sends in all (then it quits)
  LOAD_RATE        > 0: the request-rate sweep (open loop): request i is sent at
                   i / LOAD_RATE seconds after the first, by a user of its own that then stops
                   (start at least LOAD_REQUESTS users); 0: closed loop, each user sends its
                   next request when its last one ended, until LOAD_REQUESTS are sent
  LOAD_MAX_TOKENS  max_tokens per request
  LOAD_EXTRA       JSON merged into every request body (e.g. splitspec's "speculation")
  LOAD_RECORDS     where each request's record goes, one JSON line each:
                   {"start", "first", "end" (seconds, time.time()), "tokens", "error"}
"""

from __future__ import annotations

import json
import os
import sys
import time

import gevent
from locust import HttpUser, task
from locust.exception import StopUser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_stream import parse_stream  # noqa: E402

PROMPTS = json.load(open(os.environ["LOAD_PROMPTS"])) if "LOAD_PROMPTS" in os.environ else []
REQUESTS = int(os.environ.get("LOAD_REQUESTS", "1"))
RATE = float(os.environ.get("LOAD_RATE", "0"))
MAX_TOKENS = int(os.environ.get("LOAD_MAX_TOKENS", "64"))
EXTRA = json.loads(os.environ.get("LOAD_EXTRA") or "{}")
RECORDS = os.environ.get("LOAD_RECORDS", "records.jsonl")

_next = 0  # requests handed out (users are greenlets of one process: no lock needed)
_done = 0
_t0: float | None = None  # when the first request went out


class ChatUser(HttpUser):
    @task
    def chat(self) -> None:
        global _next, _done, _t0
        if _next >= REQUESTS:
            raise StopUser()
        i, _next = _next, _next + 1
        if _t0 is None:
            _t0 = time.time()
        if RATE > 0:  # its arrival time, whatever the ones before it are doing
            gevent.sleep(max(0.0, _t0 + i / RATE - time.time()))
        body = {"messages": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                **EXTRA}
        record = {"start": time.time(), "first": None, "end": None, "tokens": 0, "error": None}
        try:
            with self.client.post("/v1/chat/completions", json=body, stream=True,
                                  catch_response=True, name="chat") as resp:
                if resp.status_code != 200:
                    record["error"] = f"HTTP {resp.status_code}"
                    resp.failure(record["error"])
                else:
                    chunks, tokens, error = parse_stream(
                        resp.iter_lines(), lambda: record.update(first=time.time()))
                    record["tokens"] = tokens if tokens is not None else chunks
                    record["error"] = error
                    if error:
                        resp.failure(error)
                    else:
                        resp.success()
        except Exception as exc:  # a refused or broken connection is an error of the run
            record["error"] = repr(exc)
        record["end"] = time.time()
        with open(RECORDS, "a") as f:
            f.write(json.dumps(record) + "\n")
        _done += 1
        if _done >= REQUESTS:  # in a greenlet of its own: quit stops every user, this one too
            gevent.spawn(self.environment.runner.quit)
        if RATE > 0:
            raise StopUser()
