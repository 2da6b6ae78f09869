"""The verifier's engine: admits requests, asks proposers for drafts, verifies them in one target
forward, and streams the accepted tokens.

One step (see docs/architecture.md):
  1. the scheduler admits waiting requests while KV blocks allow and reserves each running
     sequence's slots for this step (preempting the youngest when blocks run out);
  2. drafts/collector.py: in-target methods' per-sequence states (methods/in_target.py) are asked in
     place; per proposer, one message carrying every speculating sequence's new tokens and k
     (for requests the gateway's policy marked adaptive, the goodput-best k of this step:
     drafts/adaptive_k.py), sent
     concurrently and awaited until the per-step deadline; answers are checked;
  3. step/verify.py, on the model thread: the step layout, one target forward over the packed ragged
     batch ([uncached tokens..., d1..dk] per sequence), the rejection sampler (kernels/), which
     keeps an accepted prefix plus one recovered or bonus token;
  4. _apply: the KV cache keeps the fed rows verification accepted (the rest are rolled back,
     emptied blocks freed), detokenization, stop checks, streaming; then the step's and finished
     requests' records go to the observers (telemetry/stats.py: metrics, traces).
A structured request (verifier_service/grammar/) has its grammar compiled before it is queued,
off the loop; its drafts lose the nodes the grammar forbids before the step is planned, its rows
are masked by the grammar after each row's own prefix (step/sampling_state.py), its matcher
accepts the emitted tokens after the step, and it ends ("stop") when the structure is complete.
A proposer that is late, gone or wrong costs only speculation: its sequences decode plainly.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator
from typing import Sequence as Seq

from splitspec.errors import InvalidArgument, ServiceError, Unavailable
from splitspec.methods import hybrid_components
from splitspec.params import GenerationInput, check_min_tokens
from splitspec.proposal import Draft
from verifier_service.batching.output import OutputTracker
from verifier_service.batching.prefix_cache import PrefixCache
from verifier_service.batching.scheduler import Scheduled, Scheduler
from verifier_service.batching.sequence import SequenceState, StepOutput
from verifier_service.config import VerifierConfig
from verifier_service.drafts.adaptive_k import AdaptiveK
from verifier_service.drafts.client import ProposerClient
from verifier_service.drafts.collector import DraftCollector
from verifier_service.grammar.compiler import GrammarCompiler
from verifier_service.grammar.matcher import GrammarState
from verifier_service.grammar.prune import prune_draft
from verifier_service.methods.in_target import InTargetDrafts
from verifier_service.model.runner import ModelRunner
from verifier_service.step.executor import StepExecutor
from verifier_service.step.sampling_state import bad_word_ids
from verifier_service.step.verify import SeqResult, verify_step
from verifier_service.telemetry.stats import (
    EngineObserver,
    EngineStats,
    MethodStats,
    MethodStepStats,
    StepRecord,
    StepStats,
)

__all__ = ["Engine", "EngineStats", "MethodStats"]

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: VerifierConfig, runner: ModelRunner, tokenizer,
                 proposers: dict[str, ProposerClient], eos_token_ids: set[int],
                 max_model_len: int, observers: Seq[EngineObserver] = ()):
        self.config = config
        self.runner = runner
        # runs each step's plan on the device (graphs replayed where the device has them)
        self.executor = StepExecutor.for_config(runner, config)
        self.tokenizer = tokenizer
        self.proposers = proposers
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.stats = EngineStats(max_num_seqs=config.max_num_seqs)
        self.adaptive = AdaptiveK(self.stats, config.max_num_speculative_tokens)
        self.observers = list(observers)
        # drafts from the proposers and from the registry's in-target methods
        self.drafts = DraftCollector(proposers, runner.vocab_size,
                                     config.proposer_timeout_ms / 1000, self.stats,
                                     draft_ahead=config.draft_ahead,
                                     in_target=InTargetDrafts.from_registry(
                                         runner.vocab_size, config, runner))
        # prefix caching: what a method drafting from the target's features can restore of
        # its own rows bounds what a sequence reuses (methods/in_target.py: reuse_limit)
        self.prefix = (PrefixCache(runner.kv, config.model, self.drafts.in_target.reuse_limit)
                       if config.enable_prefix_caching else None)
        self.scheduler = Scheduler(runner.kv, config.max_num_seqs, config.max_waiting,
                                   config.max_num_batched_tokens,
                                   on_admit=self.drafts.admitted,
                                   on_preempt=self.drafts.preempted,
                                   # a captured decode step holds no prompt rows
                                   mix_prefill=not self.executor.graphs_wanted,
                                   prefix=self.prefix)
        self._by_id: dict[str, SequenceState] = {}
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self._grammars: GrammarCompiler | None = None  # made with the first structured request
        self._task: asyncio.Task | None = None
        # set by drain() and fail_all(): new requests are refused with it (UNAVAILABLE)
        self.refusal: Unavailable | None = None

    # -- public API ------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def snapshot(self) -> EngineStats:
        s = self.stats
        s.running, s.waiting = self.num_running, self.num_waiting
        s.preemptions = self.scheduler.num_preemptions
        s.kv_blocks_total = self.runner.kv.num_blocks
        s.kv_blocks_free = self.runner.kv.num_free_blocks
        alloc = self.runner.kv.allocator
        s.prefix_cache_blocks, s.prefix_cache_evictions = alloc.num_cached, alloc.evictions
        if self.prefix is not None:
            s.prefix_cache_queries = self.prefix.stats.queries
            s.prefix_cache_hits = self.prefix.stats.hits
        s.in_target = self.drafts.in_target.stats()
        if self._grammars is not None:
            g = self._grammars
            s.grammar_compiles, s.grammar_compile_seconds = g.compiled, g.compile_seconds
            s.grammar_cache_hits = g.hits
        s.executor = self.executor.stats
        return s

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine-loop")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for seq in list(self._by_id.values()):
            self._finish(seq, "abort")
        self._executor.shutdown(wait=False)
        if self._grammars is not None:
            self._grammars.shutdown()

    async def on_model_thread(self, fn, *args):
        """Run fn(*args) on the thread that runs the steps (device work stays on one thread)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def num_in_flight(self) -> int:
        """Requests admitted and not finished (running, waiting or preempted)."""
        return len(self._by_id)

    async def drain(self, grace_s: float, poll_s: float = 0.05) -> int:
        """Stop admitting; let the requests in flight finish for up to grace_s seconds, then
        fail the rest with UNAVAILABLE (a gateway resumes them on another replica). Returns
        how many had to be failed."""
        self.refusal = Unavailable("verifier: draining before shutdown; retry on another replica")
        deadline = time.monotonic() + grace_s
        while self._by_id and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        left = [s for s in self._by_id.values() if not s.finished]
        for seq in left:
            self._fail(seq, Unavailable("verifier: shutting down; the request was not finished "
                                        "within the grace period"))
        return len(left)

    def fail_all(self, exc: Unavailable) -> int:
        """Fail every request in flight with exc (the engine cannot step any more: a
        tensor-parallel rank is gone) and refuse new ones with it, so that a gateway's retry
        landing before the server stops is told why too (not left to be cancelled); returns
        how many."""
        self.refusal = exc
        left = [s for s in self._by_id.values() if not s.finished]
        for seq in left:
            self._fail(seq, exc)
        return len(left)

    @property
    def grammars(self) -> GrammarCompiler:
        """The compiler of structured outputs' grammars against the served tokenizer."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(
                self.tokenizer, self.runner.vocab_size, self.eos_token_ids,
                self.config.grammar_compile_timeout_s, self.config.grammar_cache_size)
        return self._grammars

    async def generate(self, inp: GenerationInput) -> AsyncIterator[StepOutput]:
        """Stream a request's outputs; leaving early (client gone) aborts it."""
        compiled = None
        if inp.sampling.structured is not None and self.refusal is None:
            # off the loop's thread, within the time limit (InvalidArgument otherwise)
            compiled = await self.grammars.compile(inp.sampling.structured)
        seq = self.add_request(inp, compiled)
        try:
            while True:
                item = await seq.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not seq.finished:
                self.abort(seq.request_id)

    def add_request(self, inp: GenerationInput, compiled=None) -> SequenceState:
        """Queue a request; a structured one's grammar `compiled` already (generate), else
        compiled here, blocking."""
        if self.refusal is not None:
            raise copy.copy(self.refusal)  # a fresh traceback per refused request
        if not inp.prompt_token_ids:
            raise InvalidArgument("prompt", "must not be empty")
        vocab = self.runner.vocab_size
        if any(not 0 <= t < vocab for t in inp.prompt_token_ids):
            raise InvalidArgument("prompt", f"token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t in inp.resumed_output_ids):
            raise InvalidArgument("resume.output_token_ids", f"must be in [0, {vocab})")
        if len(inp.resumed_output_ids) > inp.stopping.max_tokens:
            raise InvalidArgument("resume.output_token_ids", "more tokens than max_tokens")
        n = len(inp.prompt_token_ids)
        if n + inp.stopping.max_tokens > self.max_model_len:
            raise InvalidArgument(
                "max_tokens", f"prompt ({n} tokens) + max_tokens ({inp.stopping.max_tokens}) "
                f"exceeds the model's context length ({self.max_model_len})")
        kv = self.runner.kv
        if kv.blocks_for(n + inp.stopping.max_tokens) > kv.num_blocks:
            raise InvalidArgument(
                "max_tokens", f"prompt ({n} tokens) + max_tokens ({inp.stopping.max_tokens}) "
                f"exceeds the KV cache ({kv.num_blocks * kv.block_size} tokens)")
        # the plan's shape is the gateway's; what only this verifier knows is checked here
        plan, k_limit = inp.speculation, self.config.max_num_speculative_tokens
        if plan.enabled and not self.drafts.serves(plan.method):
            raise InvalidArgument("speculation.method", f"{plan.method!r} is not served here")
        if plan.enabled and plan.k > k_limit:
            raise InvalidArgument("speculation.num_speculative_tokens",
                                  f"must be <= {k_limit} (this verifier's limit)")
        if plan.enabled and plan.num_branches > self.config.max_num_branches:
            raise InvalidArgument("speculation.num_branches",
                                  f"must be <= {self.config.max_num_branches} "
                                  "(this verifier's limit)")
        if plan.enabled:
            self.drafts.in_target.check_plan(plan, k_limit)
        inp.sampling.check_vocab(vocab)
        check_min_tokens(inp.sampling, inp.stopping)
        request_id = inp.request_id or uuid.uuid4().hex
        if request_id in self._by_id:
            raise InvalidArgument("request_id", f"{request_id!r} is already in use")
        if request_id != inp.request_id:
            inp = dataclasses.replace(inp, request_id=request_id)
        seq = SequenceState(
            inp=inp,
            tracker=OutputTracker(self.tokenizer, list(inp.prompt_token_ids), inp.stopping,
                                  self.eos_token_ids, inp.stopping.max_tokens,
                                  inp.sampling.min_tokens))
        if inp.sampling.bad_words:
            seq.bad_words_ids = bad_word_ids(inp.sampling.bad_words, self._encode_word)
        if inp.sampling.structured is not None:
            if compiled is None:
                compiled = self.grammars.compile_now(inp.sampling.structured)
            seq.grammar = GrammarState(compiled, vocab)
            kind = inp.sampling.structured.kind.value
            self.stats.structured_requests[kind] = self.stats.structured_requests.get(kind, 0) + 1
        if inp.resumed_output_ids and self._resume(seq):
            return seq  # the replayed output already ends it
        self.scheduler.add(seq)
        self._by_id[request_id] = seq
        self._wakeup.set()
        return seq

    def _encode_word(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _resume(self, seq: SequenceState) -> bool:
        """Take over the output another replica already streamed: the tokens join the
        sequence (prefilled with the prompt, at the same positions), the text counts as sent.
        True when they already end the request (its last message was lost with the replica)."""
        inp = seq.inp
        if seq.grammar is not None and not seq.grammar.accept(inp.resumed_output_ids):
            raise InvalidArgument("resume.output_token_ids",
                                  "do not follow the request's structured output")
        appended = seq.tracker.resume(list(inp.resumed_output_ids), inp.resumed_text_chars)
        if seq.grammar is not None and seq.grammar.terminated and appended.finish_reason is None:
            appended.text += seq.tracker.finish("stop")
            appended.finish_reason = "stop"
        seq.tokens.extend(inp.resumed_output_ids)
        if appended.finish_reason is not None:
            self.stats.finished_requests += 1
            seq.finished = True
            seq.outputs.put_nowait(StepOutput([], appended.text, appended.finish_reason,
                                              seq.usage()))
            self._request_done(seq, appended.finish_reason)
            return True
        if appended.text:
            seq.outputs.put_nowait(StepOutput([], appended.text))
        return False

    def abort(self, request_id: str) -> bool:
        seq = self._by_id.get(request_id)
        if seq is None or seq.finished:
            return False
        seq.aborted = True
        self._wakeup.set()
        return True

    # -- the loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self._reap_aborted()
            if not self.scheduler.running and not self.scheduler.waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - never let the loop die silently
                log.exception("engine step failed outside the model call")
                for seq in list(self.scheduler.running):
                    self._fail(seq, exc)

    def _reap_aborted(self) -> None:
        for seq in [s for s in self._by_id.values() if s.aborted and not s.finished]:
            self._finish(seq, "abort")

    async def step(self) -> None:
        start, wall = time.perf_counter(), time.time()
        self.adaptive.begin_step()
        scheduled = self.scheduler.schedule(self._draft_budget)
        if not scheduled:
            return
        try:
            step = await self._run_step(scheduled, wall)
        finally:
            self.stats.step_seconds_total += time.perf_counter() - start
        if step is not None:
            step.seconds = time.perf_counter() - start
            # in-target methods' own learning from the step is priced with their drafting
            observed = self.drafts.in_target.take_step_observe_seconds()
            if not step.prefill_tokens:  # the cost model is about decoding steps
                self.stats.add_step_cost(step.num_tokens,
                                         step.seconds - step.draft_seconds - observed, step.kind,
                                         step.num_seqs, step.method)
            for method, ms in step.per_method.items():  # what drafting ahead costs, per token
                self.drafts.ahead_policy.record(method, ms.ahead, step.seconds,
                                           ms.accepted_tokens + ms.drafts)
            self._notify("on_step", step)

    async def _run_step(self, scheduled: list[Scheduled], wall: float) -> StepStats | None:
        """Ask the proposers, verify on the model thread, apply the results."""
        collect_start = time.perf_counter()
        drafts, per_method = await self.drafts.collect(scheduled)
        draft_seconds = time.perf_counter() - collect_start
        batch = [s for s in scheduled if not s.seq.finished]  # aborted while proposers answered
        if not batch:
            return None
        for s in batch:
            if s.seq.timeline.admitted is None:
                s.seq.timeline.admitted = wall
        step_drafts = [drafts.get(s.seq) for s in batch]
        keep_hidden = [self.drafts.needs_hidden_state(s.seq) for s in batch]
        keep_argmax = [self.drafts.in_target.wants_argmax(s.seq) for s in batch]
        keep_features = [self.drafts.in_target.wants_features(s.seq) for s in batch]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self._verify, batch,
                                                 step_drafts, keep_hidden, keep_argmax,
                                                 keep_features)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the server
            log.exception("engine step failed")
            for s in batch:
                self._fail(s.seq, exc)
            return None
        self.stats.steps += 1
        end = time.time()
        step = StepStats(start=wall, seconds=0.0, num_seqs=len(batch),
                         num_tokens=sum(s.num_new + (len(d.tokens) if d else 0)
                                        for s, d in zip(batch, step_drafts)),
                         emitted_tokens=0, per_method=per_method, draft_seconds=draft_seconds,
                         prefill_tokens=sum(s.num_new for s in batch if s.num_new > 1),
                         kind=_step_kind(batch, step_drafts), method=_step_method(batch))
        for s, draft, result in zip(batch, step_drafts, results):
            emitted = isinstance(result, SeqResult)
            record = StepRecord(wall, end, len(draft.tokens) if draft else 0,
                                result.num_accepted if emitted else 0,
                                s.num_new if s.num_new > 1 or not emitted else 0)
            method = s.seq.inp.speculation.method
            if method in per_method:
                record.round_trip_s = per_method[method].round_trip_s
            s.seq.timeline.steps.append(record)
            if not isinstance(result, SeqResult):  # a prefill chunk: cached, nothing to emit
                if result is not None:  # its rows' features, for a state that reads them
                    self.drafts.in_target.prefilled(s.seq, result.features,
                                                    s.seq.num_computed)
                s.seq.num_computed += s.num_new
                self._commit(s.seq)
                continue
            step.emitted_tokens += self._apply(s.seq, draft, result, per_method.get(method))
        return step

    def _verify(self, batch: list[Scheduled], drafts: list[Draft | None], *keep) -> list:
        """On the model thread: structured requests' drafts pruned to what their grammars
        allow (in place: the step's accounting sees what was verified), then the step."""
        for i, s in enumerate(batch):
            if s.seq.grammar is not None and drafts[i] is not None:
                drafts[i], pruned = prune_draft(drafts[i], s.seq.grammar)
                self.stats.grammar_pruned_tokens += pruned
        return verify_step(self.executor, batch, drafts, *keep)

    def _draft_budget(self, seq: SequenceState) -> int:
        plan = seq.inp.speculation
        if not plan.enabled:
            return 0
        k = self.adaptive.choose(seq, self.scheduler.running) if plan.adaptive else plan.k
        remaining = seq.inp.stopping.max_tokens - len(seq.tracker.output_ids)
        room = self.max_model_len - len(seq.tokens)
        if remaining <= 1:
            return 0
        # A step emits its accepted path + 1 token: a chain longer than the tokens still due is
        # wasted work. A tree's node budget is not its depth (lookahead's window alone is
        # W x (N - 1) nodes, N + W - 2 deep), so only its rows are bounded, by the room left.
        tree = (plan.num_branches > 1 or self.drafts.in_target.serves(plan.method)
                or hybrid_components(plan.method) is not None)
        due = room - 1 if tree else min(remaining - 1, room - 1)
        return max(0, min(k, due, self.config.max_num_speculative_tokens))

    # -- results -------------------------------------------------------------------------------

    def _apply(self, seq: SequenceState, draft: Draft | None, result: SeqResult,
               ms: MethodStepStats | None) -> int:
        """Keep the accepted drafts' KV, emit the tokens; returns how many were emitted."""
        if seq.finished:
            return 0
        k, n_acc = (len(draft.tokens) if draft else 0), result.num_accepted
        position = seq.num_computed  # of the first kept row
        # Cached now: every fed row (uncached tokens + k drafts); keep the rows the verification
        # accepted, at consecutive positions, and free the blocks that leaves empty.
        self.runner.kv.keep(seq.blocks, seq.num_computed, result.kept_rows)
        seq.num_computed += len(result.kept_rows)
        seq.target_hidden = result.hidden
        seq.steps += 1
        seq.record_draft(k, n_acc)
        seq.branch_hits += result.branch_hit
        self.drafts.observe(seq, draft, n_acc, result.tokens, result.path, result.node_argmax,
                            result.features, position)
        if seq.asked_k:  # its proposer was asked this step (a draft, if any, came from it)
            method = self.stats.method(seq.inp.speculation.method)
            branches = seq.inp.speculation.num_branches
            if k:
                method.add_draft(k, n_acc, seq.inp.sampling.greedy, branches)
                # the method was asked this step: it has a record
                ms.add_draft(k, n_acc, result.branch_hit)
            method.kind(seq.inp.sampling.greedy, branches).add_asked(seq.asked_k, k, n_acc)
            seq.asked_k = 0
        tokens = result.tokens
        if seq.grammar is not None:  # nothing after the token that completes the structure
            tokens = tokens[:seq.grammar.complete_within(tokens)]
        appended = seq.tracker.append(tokens)
        seq.tokens.extend(appended.token_ids)
        self.executor.sampling.emitted(seq, appended.token_ids)
        if seq.grammar is not None and not self._grammar_emitted(seq, draft, result, appended):
            return 0
        self._commit(seq)
        # a stop condition may keep only a prefix of the tokens: their logprobs alike
        logprobs = (result.logprobs[:len(appended.token_ids)]
                    if result.logprobs is not None else None)
        self.stats.generated_tokens += len(appended.token_ids)
        if appended.token_ids and seq.timeline.first_token is None:
            seq.timeline.first_token = time.time()
        if appended.finish_reason is not None:
            self._finish(seq, appended.finish_reason, appended.token_ids, appended.text,
                         logprobs)
        elif seq.aborted:
            self._finish(seq, "abort", appended.token_ids, appended.text, logprobs)
        elif appended.token_ids or appended.text:
            seq.outputs.put_nowait(StepOutput(appended.token_ids, appended.text,
                                              logprobs=logprobs))
        return len(appended.token_ids)

    def _grammar_emitted(self, seq: SequenceState, draft: Draft | None, result: SeqResult,
                         appended) -> bool:
        """The structured request's matcher takes the tokens the step committed, exactly; a
        complete structure ends the request ("stop", the held-back text with it). False: the
        grammar refused a committed token (a fault of the masks) and the request failed."""
        if not seq.grammar.accept(appended.token_ids):
            self._fail(seq, ServiceError("structured output: the grammar refused a token the "
                                         "step emitted"))
            return False
        if seq.grammar.terminated and appended.finish_reason is None:
            appended.text += seq.tracker.finish("stop")
            appended.finish_reason = "stop"
        return True

    def _commit(self, seq: SequenceState) -> None:
        """Offer the blocks the sequence's kept rows filled to the prefix cache."""
        if self.prefix is not None:
            self.prefix.commit(seq)
            self.drafts.in_target.committed(seq)

    def _release(self, seq: SequenceState) -> None:
        seq.finished = True
        self._by_id.pop(seq.request_id, None)
        self.scheduler.remove(seq)
        self.drafts.release(seq)
        self.executor.sampling.leave(seq)

    def _finish(self, seq: SequenceState, reason: str, token_ids: list[int] | None = None,
                text: str = "", logprobs: list | None = None) -> None:
        self._release(seq)
        if reason == "abort":
            self.stats.aborted_requests += 1
        else:
            self.stats.finished_requests += 1
        seq.outputs.put_nowait(StepOutput(token_ids or [], text, reason, seq.usage(),
                                          logprobs if token_ids else None))
        self._request_done(seq, reason)

    def _fail(self, seq: SequenceState, exc: BaseException) -> None:
        self._release(seq)
        seq.outputs.put_nowait(exc)
        self._request_done(seq, "error")

    def _request_done(self, seq: SequenceState, reason: str) -> None:
        t = seq.timeline
        t.finished, t.finish_reason = time.time(), reason
        t.completion_tokens = len(seq.tracker.output_ids)
        self._notify("on_request_done", t)

    def _notify(self, event: str, record) -> None:
        for observer in self.observers:
            try:
                getattr(observer, event)(record)
            except Exception:  # noqa: BLE001 - an exporter must never fail the engine
                log.exception("engine observer %r failed on %s", observer, event)


def _step_method(batch: list[Scheduled]) -> str:
    """The one speculation method every sequence of the step was planned with, whether or not
    it drafted this step ("off": none speculates); "" for a step of several."""
    methods = {s.seq.inp.speculation.method if s.seq.inp.speculation.enabled else "off"
               for s in batch}
    return methods.pop() if len(methods) == 1 else ""


def _step_kind(batch: list[Scheduled], drafts: list) -> str:
    """What a step ran beside the forward: the tree sampler, the rejection sampler, or
    nothing (greedy chains, verified inside the forward): splitspec.goodput.STEP_KINDS."""
    if any(d is not None and not d.is_chain for d in drafts):
        return "tree"
    return "greedy" if all(s.seq.inp.sampling.greedy for s in batch) else "sampled"
