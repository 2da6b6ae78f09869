"""Grammars compiled once against the served tokenizer, off the step loop, and cached.

A structured request's grammar (splitspec.params.StructuredOutput) is compiled by xgrammar
against the target's tokenizer (TokenizerInfo over the model's vocabulary, which may be larger
than the tokenizer's: the extra ids are never allowed) in a small thread pool (xgrammar releases
the GIL while it compiles), awaited by the request's arrival with a time limit. A grammar that
does not compile, or not in time, is InvalidArgument naming its public field; the engine keeps
serving. Compiled grammars are kept in an LRU of `cache_size` entries keyed by the grammar
itself, so the thousandth request with the same schema compiles nothing; two requests arriving
together with one grammar share one compilation.

A compilation past its time limit cannot be stopped (it runs in native code): its thread
finishes it in the background and the result is cached for the next request that asks. The
limit counts from the request's arrival, a wait behind other compilations included.

JSON is compiled compact (no whitespace between tokens, separators "," and ":"): a model may
not pad its output with unbounded whitespace, which a structure would otherwise allow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
from collections import OrderedDict
from typing import Iterable

from splitspec.errors import InvalidArgument
from splitspec.params import StructuredKind, StructuredOutput

__all__ = ["GrammarCompiler", "choice_ebnf"]

_JSON_SEPARATORS = (",", ":")
_ERROR_CHARS = 300  # of xgrammar's message, in the InvalidArgument
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def choice_ebnf(choices: Iterable[str]) -> str:
    """An EBNF grammar whose language is exactly `choices` (each a quoted literal: JSON's
    escapes are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles StructuredOutputs for one tokenizer; thread-safe."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Iterable[int],
                 timeout_s: float = 10.0, cache_size: int = 64, threads: int = 2):
        import xgrammar as xgr  # a dependency of structured requests only

        self._xgr = xgr
        self._tokenizer, self._stop = tokenizer, sorted(stop_token_ids) or None
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._xgr_compiler = None  # made in the pool on first use (a large vocabulary: seconds)
        self._pool = concurrent.futures.ThreadPoolExecutor(threads,
                                                           thread_name_prefix="grammar")
        self._cache: OrderedDict[tuple, concurrent.futures.Future] = OrderedDict()
        self._lock = threading.Lock()  # the cache's
        self._making = threading.Lock()  # the xgrammar compiler's (held for seconds, in the pool)
        self.compiled = 0  # grammars compiled (cache misses)
        self.compile_seconds = 0.0  # what those compilations took, together
        self.hits = 0  # grammars asked for and found in the cache (compiled or compiling)

    # -- public --------------------------------------------------------------------------------

    async def compile(self, s: StructuredOutput):
        """The compiled grammar of `s`, awaited off the event loop's thread."""
        future = self._future(s)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)),
                                          self.timeout_s)
        except asyncio.TimeoutError:
            raise self._too_slow(s) from None

    def compile_now(self, s: StructuredOutput):
        """The same, blocking the calling thread (callers off the event loop)."""
        try:
            return self._future(s).result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise self._too_slow(s) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def cached(self) -> int:
        return len(self._cache)

    # -- inside --------------------------------------------------------------------------------

    def _future(self, s: StructuredOutput) -> concurrent.futures.Future:
        key = s.key
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return future
            future = self._pool.submit(self._compile, s)
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        future.add_done_callback(lambda f: self._forget(key, f))
        return future

    def _forget(self, key: tuple, future: concurrent.futures.Future) -> None:
        """A failed compilation is not cached (the error is the request's, raised once)."""
        if not future.cancelled() and future.exception() is None:
            return
        with self._lock:
            if self._cache.get(key) is future:
                del self._cache[key]

    @property
    def _compiler(self):
        with self._making:
            if self._xgr_compiler is None:
                info = self._xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop)
                # its own cache is unbounded: this one is bounded by entries
                self._xgr_compiler = self._xgr.GrammarCompiler(info, max_threads=1,
                                                               cache_enabled=False)
            return self._xgr_compiler

    def _compile(self, s: StructuredOutput):
        c = self._compiler
        start = time.perf_counter()
        try:
            if s.kind is StructuredKind.JSON_OBJECT:
                grammar = c.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                separators=_JSON_SEPARATORS)
            elif s.kind is StructuredKind.JSON_SCHEMA:
                grammar = c.compile_json_schema(s.spec, any_whitespace=False,
                                                separators=_JSON_SEPARATORS)
            elif s.kind is StructuredKind.REGEX:
                grammar = c.compile_regex(s.spec)
            elif s.kind is StructuredKind.CHOICE:
                grammar = c.compile_grammar(choice_ebnf(s.choices))
            else:
                grammar = c.compile_grammar(s.spec)
        except Exception as exc:  # noqa: BLE001 - xgrammar's parse errors are RuntimeErrors
            lines = str(exc).strip().splitlines() or [repr(exc)]
            # "[12:00:00] /project/cpp/regex_converter.cc:83: Regex parsing error at ..."
            message = _SOURCE_PREFIX.sub("", lines[0])
            raise InvalidArgument(s.field, "does not compile: "
                                  + message[:_ERROR_CHARS]) from None
        finally:
            self.compile_seconds += time.perf_counter() - start
        self.compiled += 1
        return grammar

    def _too_slow(self, s: StructuredOutput) -> InvalidArgument:
        return InvalidArgument(s.field, f"did not compile within {self.timeout_s:g} s "
                               "(--grammar-compile-timeout-s)")
