"""Planted bugs for the negative controls: each is a small monkeypatch of one product function
that breaks one invariant the suite claims to guard. A control test plants one, runs the guarding
check, and asserts that the check fails. They live in the test tree only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch

import gateway.rest_bodies as rest_bodies
import gateway.tool_parsers.hermes as hermes
import gateway.tools as gateway_tools
import kernels.eagle_tree as eagle_tree
import kernels.fp16_dot as fp16_dot
import kernels.hybrid_merge as hybrid_merge
import kernels.int8_dot as int8_dot
import kernels.logits_processors as logits_processors
import kernels.lookahead as lookahead
import kernels.rejection as rejection
import kernels.run_attention as run_attention
import kernels.sampling as sampling
import kernels.tree_rejection as tree_rejection
import kernels.vocab_subset as vocab_subset
import proposer_service.draft.graphs as draft_graphs
import proposer_service.draft.loop as draft_loop
import proposer_service.draft.slots as draft_slots
import proposer_service.mlp.proposer as mlp
import proposer_service.sampling as draft_sampling
import splitspec.config as service_flags
import splitspec.goodput as goodput
import verifier_service.batching.prefix_cache as prefix_cache
import verifier_service.drafts.adaptive_k as adaptive_k
import verifier_service.engine as engine_module
import verifier_service.grammar.matcher as grammar_matcher
import verifier_service.kv.cache as kv_cache
import verifier_service.kv.cpu_attention as cpu_attention
import verifier_service.kv.paged_attention as kv_paged_attention
import verifier_service.methods.eagle.batch_graphs as eagle_batch_graphs
import verifier_service.methods.eagle.checkpoint as eagle_format
import verifier_service.methods.eagle.graphs as eagle_graphs
import verifier_service.methods.eagle.head as eagle_head
import verifier_service.methods.eagle.method as eagle
import verifier_service.methods.forced_spelling as forced_spelling
import verifier_service.prompt as verifier_prompt
import verifier_service.step.executor as step_executor
import verifier_service.step.plan as step_plan
import verifier_service.step.sampler as step_sampler
import verifier_service.step.sampling_state as sampling_state
import verifier_service.step.verify as verify
from kernels.sampling import keyed_argmax, noise_key
from proposer_service.draft.proposer import DraftSession
from proposer_service.mlp.speculator import SpeculatorNorm
from splitspec import device as dev
from splitspec import health_probe, speculators_format
from verifier_service.drafts.collector import DraftCollector
from verifier_service.model.runner import ModelRunner


def residual_from_p(monkeypatch) -> None:
    """The recovered token drawn from p instead of max(0, p - q): q is taken as zero."""
    def no_q(draft_probs, draft_token_ids, rows, present, vocab):
        return torch.zeros(rows.shape[0], vocab)

    monkeypatch.setattr(rejection, "_draft_rows_dense", no_q)


def bonus_row_off_by_one(monkeypatch) -> None:
    """The bonus token read from the last draft's row instead of the row after it."""
    original = rejection.rejection_sample_reference

    def shifted(inputs):
        k = inputs.layout.num_draft_tokens
        bonus = (inputs.layout.target_offsets + k)[k > 0]
        probs = inputs.target_probs.clone()
        probs[bonus] = inputs.target_probs[bonus - 1]
        return original(dataclasses.replace(inputs, target_probs=probs))

    monkeypatch.setattr(rejection, "rejection_sample_reference", shifted)


def seeded_draws_depend_on_k(monkeypatch) -> None:
    """A seeded row's noise keyed by (k, index in the step's window) instead of its position."""
    def by_window(target_probs, layout, seeded, seeds, target_argmax):
        k = layout.num_draft_tokens.tolist()
        toff = layout.target_offsets.tolist()
        rows = torch.tensor([toff[i] + j for i in seeded for j in range(k[i] + 1)])
        keys = [noise_key(seeds[i], k[i] * 100 + j) for i in seeded for j in range(k[i] + 1)]
        out = target_argmax.clone()
        out[rows] = keyed_argmax(target_probs[rows], keys)
        return out

    monkeypatch.setattr(rejection, "_coupled_argmax", by_window)


def _runner_returning(monkeypatch, change) -> None:
    original = ModelRunner.run_plan

    def run_plan(self, *args):
        logits, hidden = original(self, *args)
        return logits, change(hidden)

    monkeypatch.setattr(ModelRunner, "run_plan", run_plan)


def hidden_state_zeroed(monkeypatch) -> None:
    """The hidden state handed to a conditioning proposer is zeros."""
    _runner_returning(monkeypatch, torch.zeros_like)


def hidden_state_shifted_by_one_position(monkeypatch) -> None:
    """The hidden state of the neighbouring row (one position off)."""
    _runner_returning(monkeypatch, lambda h: torch.roll(h, 1, dims=0))


def draft_q_is_not_the_sampled_one(monkeypatch) -> None:
    """Draft tokens drawn from another distribution than the q the proposer reports: a sharper
    one when unseeded, a flatter one (cubed noise) when seeded."""
    # the race argmax(q / E) draws from q; argmax(q / E^(1/3)) from q^3 (sharper), and
    # argmax(q / E^3) from q^(1/3) (flatter)
    drawn, keyed = draft_sampling.draw_exponentials, draft_sampling.keyed_exponentials_at
    monkeypatch.setattr(draft_sampling, "draw_exponentials",
                        lambda n, k, device: drawn(n, k, device) ** (1 / 3))
    monkeypatch.setattr(draft_sampling, "keyed_exponentials_at",
                        lambda halves, idx: keyed(halves, idx) ** 3)


def static_draft_choice_ignores_seeds(monkeypatch) -> None:
    """The captured drafting loops' choice (the draft model's, the MLP speculator's) treats
    seeded rows as unseeded (drawn noise in place of the keyed noise of their positions)."""
    original = draft_sampling.choose_static

    def unkeyed(logits, inputs, halves, noise, k):
        return original(logits, {**inputs, "keyed": torch.zeros_like(inputs["keyed"])}, halves,
                        noise, k)

    monkeypatch.setattr(draft_graphs, "choose_static", unkeyed)
    monkeypatch.setattr(mlp, "choose_static", unkeyed)


def fixed_cache_rows_drafted_one_position_late(monkeypatch) -> None:
    """The draft model's captured loop places each row's drafts one position after their own
    (RoPE and seeded noise both read the position)."""
    original = draft_graphs.DraftGraphs.draft

    def late(self, kvs, lens, pending, first_pos, k, params=None, slots=None):
        return original(self, kvs, lens, pending, [p + 1 for p in first_pos], k, params, slots)

    monkeypatch.setattr(draft_graphs.DraftGraphs, "draft", late)


def drafted_ahead_state_left_out_of_its_slot(monkeypatch) -> None:
    """A state drafted ahead takes its sequence's slot over without its own columns copied in:
    the slot keeps the columns of the draft before it."""
    def adopt(self, state, owner):
        slot, owner.slot = owner.slot, None
        state.slot, state.store = slot, None
        state.kv = self.view(slot, state.length())

    monkeypatch.setattr(draft_slots.DraftSlots, "adopt", adopt)


def finished_slot_kept_as_views(monkeypatch) -> None:
    """A finished sequence's draft cache kept for prefix reuse as views of its slot, which is
    freed (and reused by the next sequence) without the cache copied out."""
    original = draft_slots.DraftSlots.unbind

    def unbind(self, state, keep_cache=False):
        if keep_cache and state is not None and state.slot is not None:
            self._free.append(state.slot)
            state.slot = None
            return
        original(self, state, keep_cache)

    monkeypatch.setattr(draft_slots.DraftSlots, "unbind", unbind)


def mismatch_escapes_the_step(monkeypatch) -> None:
    """A proposer's late vocabulary mismatch raised out of the step (fails the whole batch)."""
    async def connected(self, method, client, group):
        return await client.ensure_connected()

    monkeypatch.setattr(DraftCollector, "_connected", connected)


def stale_draft_ahead_on_a_miss(monkeypatch) -> None:
    """An outcome that was not drafted ahead answered from a draft ahead of another outcome."""
    original = DraftSession._take_ready

    def any_ready(self, step, ready):
        if ready is not None and ready.drafts and tuple(step.new_tokens) not in ready.drafts:
            key = next(iter(ready.drafts))
            ready.drafts[tuple(step.new_tokens)] = ready.drafts[key]
        return original(self, step, ready)

    monkeypatch.setattr(DraftSession, "_take_ready", any_ready)


def speculator_norm_mean_centred(monkeypatch) -> None:
    """The MLP speculator's norms read as mean-centred LayerNorms (the mean subtracted before the
    RMS), not the accelerators' format's RMS-style ones."""
    original = SpeculatorNorm.forward

    def centred(self, x):
        return original(self, x - x.mean(-1, keepdim=True))

    monkeypatch.setattr(SpeculatorNorm, "forward", centred)


def tree_residual_not_updated(monkeypatch) -> None:
    """The tree sampler keeps p unchanged after a rejected sibling: the next sibling is tried,
    and the recovered token drawn, against the target instead of max(0, p - q)."""
    monkeypatch.setattr(tree_rejection, "_residual", lambda r, z, q, rejected: (r, z))


def lookahead_window_not_shifted(monkeypatch) -> None:
    """The lookahead window ignores how far the root moved: after a step that emitted several
    tokens every guess sits at a position other than the one it was made for."""
    original = lookahead.advance_window
    monkeypatch.setattr(lookahead, "advance_window",
                        lambda levels, outputs, n, emitted, fill:
                        original(levels, outputs, n, 1 if len(levels) >= n - 1 else emitted, fill))


def tree_keeps_first_rows(monkeypatch) -> None:
    """After a tree step the KV cache keeps the first fed rows (a chain's prefix) instead of the
    accepted path's rows: a sequence that took a lower-ranked branch attends to the wrong keys."""
    monkeypatch.setattr(tree_rejection, "path_rows",
                        lambda fed_before, path: list(range(fed_before + len(path))))


def subset_logits_one_token_off(monkeypatch) -> None:
    """A vocabulary-subset head writes each scored token's logit at the next subset token's id:
    the draft proposes tokens by other tokens' scores."""
    original = vocab_subset.scatter_logits
    monkeypatch.setattr(vocab_subset, "scatter_logits",
                        lambda sub, ids, vocab_size: original(sub, ids.roll(1), vocab_size))


def padding_rows_write_into_their_sequence(monkeypatch) -> None:
    """A bucket's padding rows write their keys and values into their sequence's own blocks
    (the columns after its real rows) instead of the trash block."""
    original = step_executor.plan_step

    def plan(layout, *args, **kwargs):
        p = original(layout, *args, **kwargs)
        if p.bucket is not None:
            v, r, bs = p.fields.views(p.host), p.bucket.rows, p.block_size
            for b, (q, start) in enumerate(zip(layout.query_lens.tolist(),
                                               layout.start_pos.tolist())):
                for j in range(q, r):
                    col = start + j
                    v["slots"][b * r + j] = v["block_tables"][b, col // bs] * bs + col % bs
        return p

    monkeypatch.setattr(step_executor, "plan_step", plan)


def greedy_verification_reads_back(monkeypatch) -> None:
    """Greedy chain verification reads the accepted counts back to the host mid-step (a sync
    inside what a graph would record)."""
    original = step_executor.greedy_chain_verify

    def verify(*args):
        tokens, num_accepted = original(*args)
        num_accepted.tolist()
        return tokens, num_accepted

    monkeypatch.setattr(step_executor, "greedy_chain_verify", verify)


def features_one_row_late(monkeypatch) -> None:
    """The features handed to a state that reads them are each row's successor's."""
    original = verify._fed_row
    monkeypatch.setattr(verify, "_fed_row", lambda plan, seq, fed: original(plan, seq, fed) + 1)

def policy_ignores_the_lookahead_limit(monkeypatch) -> None:
    """The policy takes every lookahead shape as one the verifier accepts."""
    import gateway.policy as policy

    monkeypatch.setattr(policy, "_lookahead_unfit", lambda req, info, k_max: None)


def cache_salt_ignores_the_key(monkeypatch) -> None:
    """The gateway forwards a request's own cache salt only: with API keys on, requests under
    different keys that give none share one (unsalted) prefix cache."""
    import gateway.grpc_api as grpc_api
    import gateway.rest as rest

    for module in (rest, grpc_api):
        monkeypatch.setattr(module, "request_salt", lambda own, key: own)


def cache_salt_unchecked(monkeypatch) -> None:
    """The gateway takes any cache_salt (a number, an overlong string) as it came: REST's
    declaration types it as anything, the gRPC door does not check it."""
    from typing import Any

    import pydantic

    import gateway.grpc_api as grpc_api
    import gateway.request_models as request_models

    monkeypatch.setattr(grpc_api, "check_cache_salt", lambda name, salt: None)
    for name in ("CompletionBody", "ChatBody"):
        declared = getattr(request_models, name)
        monkeypatch.setattr(request_models, name, pydantic.create_model(
            name, __base__=declared, cache_salt=(Any, None)))


def resume_drops_the_cache_salt(monkeypatch) -> None:
    """A stream resumed on another replica is sent there without its cache salt."""
    import gateway.resume as resume

    original = resume.StreamProgress.next_request

    def next_request(self):
        req = original(self)
        if req is not self.request:
            req.ClearField("cache_salt")
        return req

    monkeypatch.setattr(resume.StreamProgress, "next_request", next_request)


def prefix_index_ignores_the_salt(monkeypatch) -> None:
    """The gateway's prefix index roots every chain as if no salt were given: requests with
    different salts count as sharing a prefix."""
    import gateway.prefix_index as prefix_index

    root = prefix_index._root
    monkeypatch.setattr(prefix_index, "_root", lambda kind, salt: root(kind, None))


def prefix_index_evicts_the_newest(monkeypatch) -> None:
    """Past its cap, a replica's prefix index drops the keys it recorded last."""
    import gateway.prefix_index as prefix_index

    def insert(self, key):
        for k in reversed(key.keys):
            self._keys[k] = None
            self._keys.move_to_end(k)
        while len(self._keys) > self.max_blocks:
            self._keys.popitem(last=True)

    monkeypatch.setattr(prefix_index.PrefixIndex, "insert", insert)


def prefix_routing_ignored(monkeypatch) -> None:
    """The gateway routes every request to the least loaded replica, whatever its prefix."""
    import gateway.verifier_pool as verifier_pool

    monkeypatch.setattr(verifier_pool, "route",
                        lambda key, candidates, least, config: (least, "least_load"))


def lookahead_floor_of_the_window_alone(monkeypatch) -> None:
    """The policy's lookahead floor counts the window's nodes only, not the pool candidates'
    beside it (what the floor was before it was fixed)."""
    import gateway.policy as policy

    monkeypatch.setattr(policy, "lookahead_step_nodes",
                        lambda window, ngram, guesses: window * (ngram - 1))


def specbench_mean_of_ratios(monkeypatch) -> None:
    """Spec-Bench's speed-up taken as the mean over questions of each question's ratio of rates,
    not the ratio of the two mean rates (bench/specbench_speed.py; bench/ on sys.path)."""
    import statistics

    import specbench_speed

    def mean_of_ratios(answers, baseline):
        base = {b.question_id: b.tok_s for b in baseline}
        return statistics.fmean(a.tok_s / base[a.question_id] for a in answers)

    monkeypatch.setattr(specbench_speed, "speedup", mean_of_ratios)


def specbench_prefill_dropped(monkeypatch) -> None:
    """Spec-Bench's per-question rate timed from each turn's first token: the prefill left out."""
    import specbench_speed

    monkeypatch.setattr(specbench_speed.Answer, "tok_s", property(
        lambda a: a.tokens / sum(t.seconds - t.ttft for t in a.turns)))


def specbench_resume_ignores_settings(monkeypatch) -> None:
    """--resume compares no settings: results taken with other answer lengths or questions are
    merged into the report (bench/specbench_results.py; bench/ on sys.path)."""
    import specbench_results

    monkeypatch.setattr(specbench_results, "differences", lambda old, new: [])


def specbench_resume_runs_everything_again(monkeypatch) -> None:
    """--resume finds no finished unit in its results file: every configuration runs again."""
    import specbench_results

    monkeypatch.setattr(specbench_results.Results, "holds", lambda self, key, definition,
                        repeat_label=None: False)


def verifier_accepts_any_lookahead_default(monkeypatch) -> None:
    """The verifier's start-up check forgets lookahead's default window."""
    import verifier_service.config_check as config_check

    monkeypatch.setattr(config_check, "lookahead_window_nodes", lambda window, ngram: 0)


def server_listens_plaintext(monkeypatch) -> None:
    """A server given TLS credentials listens in plaintext anyway."""
    import splitspec.grpc_server as grpc_server

    monkeypatch.setattr(grpc_server, "listen",
                        lambda server, address, tls=None: server.add_insecure_port(address))


def caller_check_skipped(monkeypatch) -> None:
    """The allow-list of client identities is never consulted."""
    import splitspec.tls as tls

    monkeypatch.setattr(tls.PeerCheck, "__call__", lambda self, method, context: None)


def certificate_rotation_ignored(monkeypatch) -> None:
    """Changed certificate files are never read again."""
    import splitspec.tls as tls

    monkeypatch.setattr(tls.TlsFiles, "refresh", lambda self, force=False: False)

def eagle1_fc_reads_hidden_first(monkeypatch) -> None:
    """An EAGLE-1 head's fc reads [hidden state | token embedding], the format's halves
    swapped."""
    monkeypatch.setattr(eagle_head, "eagle1_input", lambda emb, hidden: torch.cat([hidden, emb],
                                                                                   -1))


def eagle_fc_bias_dropped(monkeypatch) -> None:
    """A head's fc.bias is skipped when loading (as a loader without the bias would)."""
    original = eagle_format.canonical_names
    monkeypatch.setattr(eagle_format, "canonical_names",
                        lambda raw: {k: v for k, v in original(raw).items() if k != "fc_bias"})


def eagle3_d2t_read_as_ids(monkeypatch) -> None:
    """An EAGLE-3 head's d2t read as the target ids themselves instead of offsets."""
    monkeypatch.setattr(eagle_format.EagleWeights, "draft_to_target",
                        lambda self: None if self.d2t is None else self.d2t.long().abs())


def speculators_norm_before_residual_dropped(monkeypatch) -> None:
    """The speculators-format reader leaves norm_before_residual out of the config it hands on
    (so the published formats' default, false, applies)."""
    original = speculators_format.flat_config

    def dropped(cfg):
        flat = original(cfg)
        flat.pop("norm_before_residual", None)
        return flat

    monkeypatch.setattr(speculators_format, "flat_config", dropped)


def speculators_k_and_v_swapped(monkeypatch) -> None:
    """The speculators-format reader names a head's k_proj v_proj and its v_proj k_proj (equal
    shapes: nothing refuses it)."""
    original = speculators_format.published_name
    swap = {"k_proj": "v_proj", "v_proj": "k_proj"}

    def swapped(name, kind):
        new = original(name, kind)
        for old, other in swap.items():
            if new is not None and f"self_attn.{old}." in new:
                return new.replace(f"self_attn.{old}.", f"self_attn.{other}.")
        return new

    monkeypatch.setattr(speculators_format, "published_name", swapped)


def eagle_drafts_kept_as_target_rows(monkeypatch) -> None:
    """A drafted chain's rows stay in the head's cache as if the target had computed them: the
    next advance appends after the head's own guesses instead of replacing them."""
    original = eagle_head.EagleSequence.chain

    def chain(self, k):
        out = original(self, k)
        self.length += max(k - 1, 0)
        return out

    monkeypatch.setattr(eagle_head.EagleSequence, "chain", chain)


def eagle_batched_chains_left_ranked(monkeypatch) -> None:
    """Chains drafted together come back in the order they were drafted in (longest first), not
    in the sequences' order: each sequence may get another's chain."""
    monkeypatch.setattr(eagle_head, "unrank", lambda ranked, order: ranked)


def eagle_sampled_rows_share_the_first_params(monkeypatch) -> None:
    """Sampled chains drafted together all take the first row's sampling parameters (its
    temperature, top-k, top-p, min-p) instead of each its own."""
    original = eagle_head.sampling_settings
    monkeypatch.setattr(eagle_head, "sampling_settings",
                        lambda params: original([params[0]] * len(params)))


def eagle_deferred_rows_dropped(monkeypatch) -> None:
    """The rows a step handed the head for the next flush are let go instead of advanced (the
    head falls behind, then starts over from where it lost them)."""
    def drop(self, states=None):
        for state in list(self.deferred if states is None else states):
            state.pending, state.pending_rows = [], 0
            self.deferred.pop(state, None)
        return 0

    monkeypatch.setattr(eagle.EagleMethod, "flush", drop)


def eagle_batch_rows_written_at_the_first_column(monkeypatch) -> None:
    """The batched chain writes every row's keys and values at the first row's column (one
    column for the batch, as a lone sequence has), not at each row's own."""
    original = eagle_batch_graphs.visible_columns_rows

    def first_rows(columns, col):
        col.copy_(col[:1].expand_as(col))
        return original(columns, col)

    monkeypatch.setattr(eagle_batch_graphs, "visible_columns_rows", first_rows)


def eagle_batch_advance_rows_see_later_rows(monkeypatch) -> None:
    """The batched advance lets each fed row see its sequence's later rows too (every column
    up to the last one fed), not only those up to its own."""
    original = eagle_batch_graphs.causal_columns_rows
    monkeypatch.setattr(eagle_batch_graphs, "causal_columns_rows", lambda columns, pos:
                        original(columns, pos[:, -1:].expand_as(pos)))


def step_cost_class_ignores_the_sequences(monkeypatch) -> None:
    """Every step priced in the class of one sequence, however many the batch has (the cost
    by tokens alone, as before sequence counts were kept apart)."""
    monkeypatch.setattr(goodput, "seqs_class", lambda n: 1)


def round_trip_class_ignored(monkeypatch) -> None:
    """A method's round trip fitted to every answer, however many sequences the batch priced
    has (an in-target head's share measured alone charged to each of 16 drafted together)."""
    original = goodput.MethodCounts.round_trip
    monkeypatch.setattr(goodput.MethodCounts, "round_trip",
                        lambda self, per_sequence=False, seqs=None: original(self, per_sequence))


def pause_margin_ignored(monkeypatch) -> None:
    """The per-step k pauses a request on any expected gain, however small (no margin for the
    cost model's error on the rows a pause saves)."""
    monkeypatch.setattr(adaptive_k, "PAUSE_MARGIN", 0.0)


def eagle_tree_rows_see_every_fed_row(monkeypatch) -> None:
    """A tree's fed rows attend to every fed row of the levels before, not only to their own
    ancestors."""
    original = eagle_head.tree_mask
    monkeypatch.setattr(eagle_head, "tree_mask", lambda state, base, level:
                        torch.ones_like(original(state, base, level)))


def eagle_graph_row_blind_to_itself(monkeypatch) -> None:
    """The captured chain's fed row sees the columns before its own, not its own keys."""
    monkeypatch.setattr(eagle_graphs, "visible_columns",
                        lambda columns, col: (columns < col)[None, None, None])


def eagle_graph_sampled_keys_one_position_off(monkeypatch) -> None:
    """The captured sampled EAGLE chain keys a seeded token's noise by the next position."""
    monkeypatch.setattr(eagle_graphs, "noise_key", lambda seed, pos: noise_key(seed, pos + 1))


def eagle_graph_tree_rows_see_every_fed_row(monkeypatch) -> None:
    """A captured EAGLE tree's frontier rows see every fed row, not only their ancestors."""
    def everything(columns, base, ancestors, level, k):
        seen = (columns - base) < (level - 1) * k  # committed and every fed column
        return seen[None, None, None].expand(1, 1, k, -1)

    monkeypatch.setattr(eagle_graphs, "tree_columns", everything)


def eagle_graph_advance_rows_see_later_rows(monkeypatch) -> None:
    """The captured advance's rows see every row fed with them, not only those before."""
    monkeypatch.setattr(eagle_graphs, "causal_columns", lambda columns, pos: (
        columns[None, :] <= pos[-1]).expand(len(pos), -1)[None, None])


def eagle_tp_head_reads_the_rank_shard(monkeypatch) -> None:
    """Under tensor parallelism rank 0's EAGLE head takes the lean forward's tables, which
    are that rank's vocabulary shards, as the whole embedding and output head."""
    monkeypatch.setattr(ModelRunner, "take_vocab_tables", lambda self: (
        self._lean.embed, getattr(self._lean.head, "weight", None)))


def eagle_scratch_over_the_root(monkeypatch) -> None:
    """Drafted rows written one column early: the first overwrites the root row's keys."""
    monkeypatch.setattr(eagle_head.EagleSequence, "scratch_column",
                        lambda self, depth: self.length + depth - 2)


def eagle_q_is_not_the_sampled_one(monkeypatch) -> None:
    """A sampled EAGLE chain draws from another distribution than the q it reports (sharper
    unseeded, flatter noise seeded)."""
    draw, noise = eagle_head.draw_exponentials, eagle_head.keyed_exponentials
    monkeypatch.setattr(eagle_head, "draw_exponentials",
                        lambda rows, vocab, device: draw(rows, vocab, device) ** 3)
    monkeypatch.setattr(eagle_head, "keyed_exponentials",
                        lambda keys, idx: noise(keys, idx) ** 3)


def ttt_drafted_rows_without_their_own_keys(monkeypatch) -> None:
    """EAGLE-3's training-time test lets a drafted row see the root rows' keys only, never its
    own nor its chain's (drafting does see them)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import eagle_ttt

    original = eagle_ttt.DiagonalAttention.__call__

    def call(self, q, k, v):
        if not self.keys:
            return original(self, q, k, v)
        self.keys.append(k)
        self.values.append(v)
        return self.head.attention(q, self.keys[0], self.values[0], self.causal[None, None])

    monkeypatch.setattr(eagle_ttt.DiagonalAttention, "__call__", call)


def tp_vocab_rows_off_by_one(monkeypatch) -> None:
    """A tensor-parallel rank's vocabulary shard (embedding and head rows) starts one row late:
    every rank looks up, and scores, its neighbour's tokens."""
    import splitspec.tensor_parallel as tp

    original = tp._vocab_rows

    def shifted(weight, group):
        rows, start = original(weight.roll(-1, 0), group)
        return rows, start

    monkeypatch.setattr(tp, "_vocab_rows", shifted)


def tp_follower_drops_moves(monkeypatch) -> None:
    """The other ranks of a tensor-parallel verifier skip rank 0's kept-row moves: after a tree
    or lookahead step their KV cache shards hold rows rank 0's no longer does."""
    import verifier_service.kv.journal as journal_ops
    import verifier_service.tp.worker as worker

    def zero_only(kv, journal):
        at, kept = 0, []
        while at < len(journal):
            op, n = int(journal[at]), int(journal[at + 1])
            width = 2 + (n if op == journal_ops.ZERO else 2 * n)
            if op == journal_ops.ZERO:
                kept.append(journal[at:at + width])
            at += width
        if kept:
            journal_ops.replay_journal(kv, np.concatenate(kept))

    monkeypatch.setattr(worker, "replay_journal", zero_only)


def tp_journal_sent_apart(monkeypatch) -> None:
    """Rank 0 sends each step's cache journal in a broadcast of its own before the plan."""
    import verifier_service.tp.broadcast as tpb

    def step(self, plan):
        self.steps += 1
        self._channel.send(tpb.encode(0, None, self.kv.take_journal()))
        self._channel.send(tpb.encode(tpb.STEP, plan, np.zeros(0, dtype=np.int64)))

    monkeypatch.setattr(tpb.PlanBroadcast, "step", step)


def request_scales_gains_by_a_power(monkeypatch) -> None:
    """A request's positions priced as its method's gains times (own / method acceptance)^j,
    capped by the rows: a request a little better than its method accepts every deep token."""
    def powered(self, acceptance, hit_rate):
        h = hit_rate / self.hit_rate if self.hit_rate > 0 else 1.0
        a = acceptance / self.acceptance if self.acceptance > 0 else 1.0
        positions = []
        for j, (rows, gain) in enumerate(self.positions, 1):
            rows = min(rows * h, 1.0)
            positions.append((rows, min(gain * h * a ** j, rows)))
        return dataclasses.replace(self, acceptance=acceptance, hit_rate=hit_rate,
                                   positions=tuple(positions))

    monkeypatch.setattr(goodput.MethodModel, "for_request", powered)


def step_priced_at_mean_rows(monkeypatch) -> None:
    """A step priced at the cost of its mean rows, whatever rows its drafts really have."""
    def at_mean(self, k_max, cost, others_tokens=0.0):
        return [cost(others_tokens + (self.tokens(k) if k else 1.0)) for k in range(k_max + 1)]

    monkeypatch.setattr(goodput.MethodModel, "step_seconds", at_mean)


def eagle_tree_mask_written_from_host(monkeypatch) -> None:
    """The tree's ancestor mask set by an advanced-index write of a Python True: on a device
    the value is copied in from the host (a sync, and a refused copy inside a capture)."""
    real = eagle_tree.next_level

    def from_host(state, level, logp):
        toks, rows = real(state, level, logp)
        k = state.top_k
        fed = (level - 1) * k + torch.arange(k, device=logp.device)
        state.ancestors[torch.arange(k, device=logp.device), fed] = True
        return toks, rows

    monkeypatch.setattr(eagle_graphs, "next_level", from_host)
    monkeypatch.setattr(eagle_head, "next_level", from_host)


def eagle_pending_chain_not_copied_out(monkeypatch) -> None:
    """A pending chain's tokens left as a view of the static buffer: the next sequence's chain
    overwrites them before the step's one read back."""
    real = eagle_graphs.EagleGraphs.pending_chain

    def view(self, seq, k):
        real(self, seq, k)
        return eagle_graphs.PendingDraft([self.tokens[:k]], [], lambda i, f: i[0].tolist())

    monkeypatch.setattr(eagle_graphs.EagleGraphs, "pending_chain", view)


def undrafted_seeded_rows_keyed_one_position_late(monkeypatch) -> None:
    """A step with nothing to verify keys a seeded row's token one position late: speculation
    off then differs from the coupled verification of the same positions."""
    real = verify._sample_tokens

    def late(logits, probs, layout, params):
        shifted = dataclasses.replace(layout, sample_positions=layout.sample_positions + 1)
        return real(logits, probs, shifted, params)

    monkeypatch.setattr(verify, "_sample_tokens", late)


def min_p_renormalises_rows_without_it(monkeypatch) -> None:
    """min-p's renormalisation applied to every row where the stage runs (always, in the
    static form a graph records): a row without min-p gets another p, in its last bits, than
    the eager sampler gives it by skipping the stage."""
    real = sampling.apply_sampling_params

    def every_row(logits, temperature, top_k, top_p, min_p, static=False):
        probs = real(logits, temperature, top_k, top_p, min_p, static)
        return probs / probs.sum(dim=-1, keepdim=True) if static else probs

    monkeypatch.setattr(sampling, "apply_sampling_params", every_row)


def step_sampler_keyed_one_position_late(monkeypatch) -> None:
    """The step sampler keys a seeded row's noise one position late."""
    real = step_sampler.StepSampler.__call__

    def late(self, logits, params, positions):
        return real(self, logits, params, [at + 1 for at in positions])

    monkeypatch.setattr(step_sampler.StepSampler, "__call__", late)


def device_draft_ids_one_row_late(monkeypatch) -> None:
    """A chain held on the device copied into the step's input one fed row late."""
    real = step_plan.StepPlan.draft_offsets

    def late(self, seq, row, k):
        ids_at, draft_at = real(self, seq, row, k)
        return ids_at + 1, draft_at

    monkeypatch.setattr(step_plan.StepPlan, "draft_offsets", late)


def sampler_reads_the_argmax_back(monkeypatch) -> None:
    """The chain sampler reads the target's argmax back to the host (a sync per sampled step)."""
    original = rejection._coupled_argmax

    def coupled(target_probs, layout, seeded, seeds, target_argmax):
        target_argmax.tolist()
        return original(target_probs, layout, seeded, seeds, target_argmax)

    monkeypatch.setattr(rejection, "_coupled_argmax", coupled)


def sampler_copies_uniforms_in_blocking(monkeypatch) -> None:
    """The acceptance uniforms are drawn on the host and copied in with a blocking copy (on a
    device: the host waits for the stream before the copy)."""

    def uniforms(layout, rows, device):
        return torch.rand(layout.num_drafts).to(device)

    monkeypatch.setattr(rejection, "draw_uniforms", uniforms)
    monkeypatch.setattr(tree_rejection, "draw_uniforms", uniforms)


def prefix_key_without_parent(monkeypatch) -> None:
    """A block's prefix key digests its own tokens only: equal blocks after different prefixes
    share one key (and one block of keys and values)."""
    from verifier_service.kv import prefix

    def extend(keys, root, tokens, block_size, num_tokens):
        for i in range(len(keys), num_tokens // block_size):
            keys.append(prefix.block_key(root, tokens[i * block_size:(i + 1) * block_size]))
        return keys

    monkeypatch.setattr(prefix_cache, "extend_keys", extend)


def prefix_cache_ignores_the_salt(monkeypatch) -> None:
    """Every request's keys are rooted as if it gave no cache salt."""
    from verifier_service.kv import prefix

    monkeypatch.setattr(prefix_cache, "root_key", lambda model, salt: prefix.root_key(model, None))


def prefix_commit_past_the_kept_rows(monkeypatch) -> None:
    """Blocks are offered to the cache up to the sequence's newest token, whose row is not
    computed yet: the block ending there holds a rejected draft's row (or nothing)."""
    def commit(self, seq):
        n = len(seq.tokens)
        if n // self.kv.block_size > seq.blocks.num_final:
            self.kv.commit(seq.blocks, self.keys(seq, n), n)

    monkeypatch.setattr(prefix_cache.PrefixCache, "commit", commit)


def prefix_hit_rewrites_the_last_shared_row(monkeypatch) -> None:
    """A sequence admitted on cached blocks starts computing one row early: its first step
    writes into, and rolls back from, the last block it shares."""
    admitted = prefix_cache.PrefixCache.admitted

    def admit(self, seq, hits):
        admitted(self, seq, hits)
        if hits:
            seq.num_computed -= 1

    monkeypatch.setattr(prefix_cache.PrefixCache, "admitted", admit)


def cached_block_handed_out_while_held(monkeypatch) -> None:
    """Taking a cached block leaves it on the free queue: an allocation can hand it out while
    a sequence still reads it."""
    def acquire(self, blocks):
        for block in blocks:
            self._refs[block] += 1

    monkeypatch.setattr(kv_cache.BlockAllocator, "acquire", acquire)


def draft_prefix_one_column_off(monkeypatch) -> None:
    """A reused draft cache is copied from one column on: every position's keys and values are
    its successor's."""
    from proposer_service.draft import prefix as draft_prefix

    seed = draft_prefix.DraftPrefixCache.seed

    def shifted(self, history, live):
        state = seed(self, history, live)
        if state.kv is not None:
            state.kv = [(torch.cat([k[:, :, 1:], k[:, :, -1:]], 2),
                         torch.cat([v[:, :, 1:], v[:, :, -1:]], 2)) for k, v in state.kv]
        return state

    monkeypatch.setattr(draft_prefix.DraftPrefixCache, "seed", shifted)


def eagle_rows_restored_as_blocks(monkeypatch) -> None:
    """An EAGLE state restored on cached blocks counts its rows in blocks, not positions: the
    target's rows that follow no longer line up, and the head drafts nothing."""
    from verifier_service.methods.eagle import method as eagle_method

    restore = eagle_method.EagleState.restore

    def counted_in_blocks(self, keys, num_tokens):
        restore(self, keys, num_tokens)
        if self.seq is not None and self.seq.length:
            self.seq.length //= self.method.rows.block_size

    monkeypatch.setattr(eagle_method.EagleState, "restore", counted_in_blocks)


def lone_surrogates_let_through(monkeypatch) -> None:
    """The REST door no longer checks its strings' Unicode first: a lone surrogate is refused
    only as a malformed value (pydantic's strict strings), without saying why, and inside a
    message's content or a prompt list, under another name."""
    import gateway.request_models as request_models

    monkeypatch.setattr(request_models, "_check_unicode", lambda body: None)


def dummy_weights_ignore_the_seed(monkeypatch) -> None:
    """--load-format dummy draws its weights from the process's global generator: the seed is
    not honoured (two loads with one seed differ; the run is not reproducible)."""
    import splitspec.dummy_weights as dummy_weights

    @torch.no_grad()
    def unseeded(module, seed):
        for p in module.parameters():
            p.uniform_(dummy_weights.LOW, dummy_weights.HIGH)
        return module

    monkeypatch.setattr(dummy_weights, "fill_dummy_", unseeded)


def lean_rope_unscaled(monkeypatch) -> None:
    """The lean forward recomputes RoPE's default frequencies from rope_theta instead of reading
    the model's (llama3 / linear / yarn scaling dropped)."""
    import splitspec.lean_llama as lean_llama

    real = lean_llama.LeanDecoder.__init__

    def unscaled(self, model, *args, **kwargs):
        cfg, rotary = model.config, model.get_decoder().rotary_emb
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        scaled, scale = rotary.inv_freq, rotary.attention_scaling
        rotary.inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        rotary.attention_scaling = 1.0
        try:
            real(self, model, *args, **kwargs)
        finally:
            rotary.inv_freq, rotary.attention_scaling = scaled, scale

    monkeypatch.setattr(lean_llama.LeanDecoder, "__init__", unscaled)


def kv_budget_forgets_the_weights(monkeypatch) -> None:
    """--gpu-memory-utilization hands the KV cache F x the device's memory less everything but
    the weights: the cache and the weights together exceed F (out of memory at load)."""
    import verifier_service.kv.budget as kv_budget

    def kv_bytes(self):
        return self.usable_bytes - self.heads_bytes - self.workspace_bytes - self.graphs_bytes

    monkeypatch.setattr(kv_budget.MemoryBudget, "kv_bytes", property(kv_bytes))


def tree_mask_without_closure(monkeypatch) -> None:
    """The device-built tree mask holds each row's parent and itself, never the ancestors
    further up (the transitive closure skipped): a node two levels deep does not see the root."""
    import kernels.tree_layout as tree_layout

    monkeypatch.setattr(tree_layout, "_closure_steps", lambda max_q: 0)


def device_tree_ranks_across_sequences(monkeypatch) -> None:
    """The tree sampler's children table from device parents ranks a node among every earlier
    node with the same parent index, its own sequence's or not (the second tree's siblings
    shift, some past the table)."""
    def ranks(seq, local, parents):
        n = torch.arange(parents.numel(), device=parents.device)
        return ((n[None, :] < n[:, None]) & (parents[None, :] == parents[:, None])).sum(1)

    monkeypatch.setattr(tree_rejection, "_sibling_ranks", ranks)


def device_drafts_read_back_before_the_plan(monkeypatch) -> None:
    """The step reads its drafts left on the device back before planning (a wait of their
    own), as it did for trees and sampled chains."""
    import verifier_service.step.device_drafts as device_drafts
    from verifier_service.methods.in_target import read_back

    real = device_drafts.held

    def held(drafts):
        at = real(drafts)
        if at:
            read_back([drafts[i] for i in at], dev.HostFetch(drafts[at[0]].device_tokens.device))
        return []

    monkeypatch.setattr(device_drafts, "held", held)


def device_q_unchecked(monkeypatch) -> None:
    """The step samples a device draft's q as it came, never checked (finite, summing to 1,
    the token in its support)."""
    import verifier_service.step.device_drafts as device_drafts

    def unchecked(drafts, device):
        return None, [device_drafts.device_q(d) if d is not None else None for d in drafts]

    monkeypatch.setattr(device_drafts, "q_guard", unchecked)


def hybrid_shared_prefix_kept_twice(monkeypatch) -> None:
    """Hybrid drafts: a common prefix of two candidates is never merged (kept once per drafter,
    each copy costing the node budget)."""
    monkeypatch.setattr(hybrid_merge, "_mergeable", lambda existing, new, merge_sampled: False)


def hybrid_sampled_duplicates_merged(monkeypatch) -> None:
    """Hybrid drafts: identical sampled guesses merged into the first one's node (the second
    drafter's node is then there only when it drew another token, but carries its plain q)."""
    monkeypatch.setattr(hybrid_merge, "_mergeable", lambda existing, new, merge_sampled: True)


def hybrid_node_takes_another_candidates_q(monkeypatch) -> None:
    """Hybrid drafts: each candidate's nodes carry the next candidate's q rows (by node index,
    with their own tokens)."""
    original = hybrid_merge.merge_candidates

    def rotated(candidates, max_nodes, merge_sampled):
        sampled = [i for i, c in enumerate(candidates) if c.q is not None]
        swapped = list(candidates)
        for i, j in zip(sampled, sampled[1:] + sampled[:1]):
            other = candidates[j].q
            rows = [other[n % len(other)] for n in range(len(candidates[i].tokens))]
            swapped[i] = dataclasses.replace(candidates[i], q=rows)
        return original(swapped, max_nodes, merge_sampled)

    monkeypatch.setattr(hybrid_merge, "merge_candidates", rotated)


def hybrid_node_limit_ignored(monkeypatch) -> None:
    """Hybrid drafts: every candidate's nodes kept, whatever the node budget."""
    original = hybrid_merge.merge_candidates
    monkeypatch.setattr(hybrid_merge, "merge_candidates",
                        lambda candidates, max_nodes, merge_sampled:
                        original(candidates, 10**6, merge_sampled))


def hybrid_gate_ignored(monkeypatch) -> None:
    """Gated hybrids: every tier drafts every step, whatever the earlier tiers drafted."""
    monkeypatch.setattr(hybrid_merge, "tier_suffices", lambda *args, **kwargs: False)


def hybrid_gate_inverted(monkeypatch) -> None:
    """Gated hybrids: the later tier drafts where the earlier one did, not where it did not."""
    original = hybrid_merge.tier_suffices
    monkeypatch.setattr(hybrid_merge, "tier_suffices",
                        lambda *args, **kwargs: not original(*args, **kwargs))


def policy_ignores_the_prompt(monkeypatch) -> None:
    """auto prices every request as a short-prompt one, whatever its prompt."""
    import gateway.policy as policy

    monkeypatch.setattr(policy, "prompt_class", lambda prompt_tokens: "short")


def policy_prices_a_class_without_its_data(monkeypatch) -> None:
    """auto prices each method by its acceptance over all requests, never the request's class."""
    import gateway.policy as policy

    monkeypatch.setattr(policy, "class_model",
                        lambda model, measured, min_tried, quoting=False: model)


def policy_has_no_cold_default(monkeypatch) -> None:
    """auto without a cold default: every unmeasured registered method competes on the prior."""
    import gateway.policy as policy

    monkeypatch.setattr(policy, "cold_default", lambda candidates, tried, enough: None)


def policy_keeps_one_cold_chain(monkeypatch) -> None:
    """auto's cold default is always the first retrieval method, never each of them in turn:
    the ones it did not start on are never measured."""
    import gateway.policy as policy

    def first(candidates, tried, enough):
        chains = policy.retrieval_chains(candidates)
        return chains[0] if chains and tried(chains[0]) < enough else None

    monkeypatch.setattr(policy, "cold_default", first)


def policy_weighs_no_gated_hybrids(monkeypatch) -> None:
    """auto's candidates leave out the gated hybrids (hybrid:suffix|ngram and the like)."""
    import gateway.policy as policy

    original = policy._hybrids
    monkeypatch.setattr(policy, "_hybrids",
                        lambda methods: tuple(h for h in original(methods) if "|" not in h))


def class_acceptance_counts_every_step_rejected(monkeypatch) -> None:
    """A finished request's class acceptance bounds its rejections by its steps, drafting or
    not, whatever its verifier counted."""
    import gateway.estimates as estimates

    original = estimates.request_acceptance
    monkeypatch.setattr(estimates, "request_acceptance",
                        lambda accepted, proposed, steps, rejections=None:
                        original(accepted, proposed, steps))


def _scripts_module(name: str):
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    return importlib.import_module(name)


def eagle_data_resume_reads_first_shard_only(monkeypatch) -> None:
    """The EAGLE data generation's resume reads its first shard only: a rerun answers the
    later shards' prompts again."""
    eed = _scripts_module("eagle_engine_data")
    original = eed.shard_paths
    monkeypatch.setattr(eed, "shard_paths", lambda data: original(data)[:1])


def eagle_overlap_ngrams_one_word_longer(monkeypatch) -> None:
    """The training requests' overlap check compares n-grams one word longer than its n: an
    exactly n-word copy slips through."""
    ed = _scripts_module("eagle_data")
    original = ed.ngrams
    monkeypatch.setattr(ed, "ngrams", lambda text, n=ed.WORD_NGRAM: original(text, n + 1))


def eagle_teacher_forced_features_one_position_late(monkeypatch) -> None:
    """The teacher-forced features hand each position the next position's layer inputs."""
    ef = _scripts_module("eagle_features")
    original = ef.teacher_forced

    def late(model, seqs, layer_ids, top_k):
        out = original(model, seqs, layer_ids, top_k)
        return [(torch.cat([f[1:], f[-1:]]), i, p, a) for f, i, p, a in out]

    monkeypatch.setattr(ef, "teacher_forced", late)


def eagle_warm_start_fc_not_unfolded(monkeypatch) -> None:
    """Continuing a stored EAGLE head takes its fc as stored: this run's feature scale is then
    folded in a second time when the head is written."""
    ef = _scripts_module("eagle_fit")

    def start_from(self, w):
        with torch.no_grad():
            for n in ef.PARAMS:
                getattr(self, n).copy_(getattr(w, n).float())

    monkeypatch.setattr(ef.HeadParams, "start_from", start_from)


def eagle_gonogo_either_measure(monkeypatch) -> None:
    """The EAGLE go/no-go lets a candidate replace the shipped head when it is better on either
    measure of any kind."""
    gonogo = _scripts_module("eagle_gonogo")

    def lenient(shipped, candidate):
        return any(candidate[k][m] > shipped[k][m] for k in shipped
                   for m in ("first_position_acceptance", "mean_accepted_per_step"))

    monkeypatch.setattr(gonogo, "verdict", lenient)


def eagle_code_weight_ignored(monkeypatch) -> None:
    """EAGLE training weighs every answer alike whatever --code-weight says."""
    ef = _scripts_module("eagle_fit")
    monkeypatch.setattr(ef, "kind_weights", lambda records, code_weight: [1.0] * len(records))


def runs_weighed_apart(monkeypatch) -> None:
    """Attention over runs normalises each run's probabilities within the run and averages the
    runs' outputs: every run weighs the same, whatever share of the row's softmax it holds."""
    def apart(p, v_cache, runs):
        out, col = 0, 0
        for first, n in runs:
            part = p[..., col:col + n]
            out = out + torch.matmul(part / part.sum(-1, keepdim=True),
                                     v_cache[first:first + n].transpose(0, 1))
            col += n
        return out / len(runs)

    monkeypatch.setattr(run_attention, "weigh_runs", apart)


def run_read_one_slot_late(monkeypatch) -> None:
    """A lone sequence's last run of slots read from one slot after its first: its first
    column's key and value skipped, the slot after its last column's read in their place."""
    real = kv_paged_attention.slot_runs

    def shifted(blocks, context_len, block_size):
        runs = real(blocks, context_len, block_size)
        return runs[:-1] + ((runs[-1][0] + 1, runs[-1][1]),) if runs else runs

    monkeypatch.setattr(kv_paged_attention, "slot_runs", shifted)
    monkeypatch.setattr(cpu_attention, "slot_runs", shifted)


def penalty_counts_leave_out_earlier_drafts(monkeypatch) -> None:
    """A verified row's history is the committed output alone: chain row i does not count
    drafts[:i] (the penalties of a row deeper in the draft see too little)."""
    monkeypatch.setattr(sampling_state, "_path", lambda parents, node: [])


def tree_node_counts_its_siblings(monkeypatch) -> None:
    """A tree node's history is every node drafted before it, siblings and their subtrees
    included (right for a chain, wrong for a tree)."""
    monkeypatch.setattr(sampling_state, "_path", lambda parents, node: list(range(node + 1)))


def min_tokens_counted_from_the_prompt(monkeypatch) -> None:
    """min_tokens compared with the prompt and output together: EOS is allowed too early."""

    def from_prompt(self, seq, r, slot, path):
        return len(seq.tokens) + len(path) < int(self.ints[1, slot])

    monkeypatch.setattr(sampling_state.SamplingState, "_before_min_tokens", from_prompt)


def logit_bias_left_off_the_target(monkeypatch) -> None:
    """The target's rows are processed without the request's logit bias (as if it shaped only
    a drafter's q)."""
    real = logits_processors.process_rows

    def unbiased(x, p):
        return real(x, dataclasses.replace(p, bias=None))

    monkeypatch.setattr(logits_processors, "process_rows", unbiased)


def help_default_shown_twice(monkeypatch) -> None:
    """A service flag's default appended to its help even where the help says it in words
    (the verifier's --served-model-name: "(default: directory name) (default: none)")."""
    monkeypatch.setattr(service_flags, "with_default",
                        lambda help_text, default, repeatable=False:
                        f"{help_text} (default: {service_flags.shown_default(default)})")


def health_flag_without_help(monkeypatch) -> None:
    """splitspec-health's --timeout-s registered without a help text."""
    real = health_probe.parser

    def parser():
        p = real()
        next(a for a in p._actions if "--timeout-s" in a.option_strings).help = None
        return p

    monkeypatch.setattr(health_probe, "parser", parser)


def switch_default_unsaid(monkeypatch) -> None:
    """A service's on/off flag shows no default (its help text only)."""
    real = service_flags.with_default
    monkeypatch.setattr(service_flags, "with_default",
                        lambda help_text, default, repeatable=False: help_text
                        if isinstance(default, bool) else real(help_text, default, repeatable))


def drafters_ignore_logit_bias(monkeypatch) -> None:
    """The draft model and the MLP speculator draft from their own logits alone: a request's
    logit bias and allowed ids shape the target, not what is proposed for it."""
    monkeypatch.setattr(draft_loop, "logit_offsets", lambda params, vocab, device: None)
    monkeypatch.setattr(mlp, "logit_offsets", lambda params, vocab, device: None)


def health_flag_undocumented(monkeypatch) -> None:
    """splitspec-health gains a flag that docs/reference/commands.md does not list."""
    real = health_probe.parser

    def parser():
        p = real()
        p.add_argument("--retries", type=int, default=3, help="tries before failing (default: 3)")
        return p

    monkeypatch.setattr(health_probe, "parser", parser)


def gateway_metric_undocumented(monkeypatch) -> None:
    """The gateway exports a counter that docs/reference/metrics.md does not list."""
    from gateway.metrics import GatewayMetrics
    from splitspec.telemetry.metrics import counter

    real = GatewayMetrics.collect

    def collect(self):
        yield from real(self)
        yield counter("splitspec_gateway_retries", "Generations retried on another replica",
                      samples=[((), 0)])

    monkeypatch.setattr(GatewayMetrics, "collect", collect)


def docs_link_to_a_missing_page(docs) -> None:
    """A page of a copy of docs/ links to a page that does not exist."""
    page = docs / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the old performance page](performance.md).\n")


def docs_heading_renamed_under_a_link(docs) -> None:
    """A heading that another page links to by its anchor renamed (api.md links to
    architecture.md's prefix-caching section)."""
    page = docs / "architecture.md"
    text = page.read_text()
    heading = "### Prefix caching (verifier_service/kv/prefix.py"
    assert heading in text
    page.write_text(text.replace(heading, "### Prefix cache (verifier_service/kv/prefix.py"))


def docs_link_to_a_missing_report(docs) -> None:
    """A page links to a report under bench/reports/ that does not exist."""
    page = docs / "benchmarking.md"
    page.write_text(page.read_text() + "\n[2025](../bench/reports/2025-history-performance.md)\n")


def grammar_mask_one_row_late(monkeypatch) -> None:
    """A draft node's row is masked by the grammar's state before the node's own token (its
    parent's row): each row one token behind its prefix."""
    real = grammar_matcher.GrammarState.fill_rows

    def late(self, tokens, parents, bitmask, first):
        real(self, tokens, parents, bitmask, first)
        rows = bitmask[first:first + 1 + len(tokens)].clone()
        for node, parent in enumerate(parents):
            bitmask[first + 1 + node] = rows[parent + 1]

    monkeypatch.setattr(grammar_matcher.GrammarState, "fill_rows", late)


def grammar_node_masked_with_its_siblings_state(monkeypatch) -> None:
    """The tree walk rolls a child back only after all its siblings: a node's row is the
    grammar's state after its earlier siblings' tokens too (right for a chain, wrong for a
    tree)."""

    def fill_rows(self, tokens, parents, bitmask, first):
        children = grammar_matcher.children_of(parents)
        m = self.matcher

        def visit(node, row):
            self._fill(bitmask, row)
            taken = 0
            for child in children[node]:
                if not m.is_terminated() and m.accept_token(int(tokens[child])):
                    taken += 1
                    visit(child, first + 1 + child)
                else:
                    bitmask[first + 1 + child] = bitmask[row]
            if taken:
                m.rollback(taken)

        visit(-1, first)

    monkeypatch.setattr(grammar_matcher.GrammarState, "fill_rows", fill_rows)


def grammar_matcher_advanced_by_rejected_drafts(monkeypatch) -> None:
    """After a step the matcher takes the whole draft and the step's last token, not the
    emitted tokens: rejected drafts move the grammar's state."""
    real = engine_module.Engine._grammar_emitted

    def drafted(self, seq, draft, result, appended):
        if draft is None or not draft.tokens:
            return real(self, seq, draft, result, appended)
        taken = dataclasses.replace(appended, token_ids=list(draft.tokens)
                                    + appended.token_ids[result.num_accepted:])
        ok = real(self, seq, draft, result, taken)
        appended.text, appended.finish_reason = taken.text, taken.finish_reason
        return ok

    monkeypatch.setattr(engine_module.Engine, "_grammar_emitted", drafted)


# -- tools ------------------------------------------------------------------------------------

def hermes_drops_text_before_a_call(monkeypatch) -> None:
    """The content just before a <tool_call> is dropped instead of kept."""
    real = hermes.HermesParser._content

    def content(self, text):
        if not self._in_call and self._buf[len(text):].startswith(hermes.START):
            return []
        return real(self, text)

    monkeypatch.setattr(hermes.HermesParser, "_content", content)


def hermes_holds_nothing_back(monkeypatch) -> None:
    """Streamed text that may start a <tool_call> is sent as content at once."""
    monkeypatch.setattr(hermes, "_held", lambda text: 0)


def tool_deltas_lose_an_argument_fragment(monkeypatch) -> None:
    """A stream chunk's second piece of a call's arguments is not sent."""
    real = rest_bodies.delta_tool_calls
    seen: dict[int, int] = {}

    def lossy(events):
        out = []
        for frag in real(events):
            if "id" not in frag:
                seen[frag["index"]] = seen.get(frag["index"], 0) + 1
                if seen[frag["index"]] == 2:
                    continue
            out.append(frag)
        return out

    monkeypatch.setattr(rest_bodies, "delta_tool_calls", lossy)


def required_schema_ignores_parameters(monkeypatch) -> None:
    """tool_choice required holds each call's parameters to any object, not its tool's schema."""
    real = gateway_tools.required_schema

    def loose(functions, parallel=True):
        schema = real(functions, parallel)
        for branch in schema["items"]["anyOf"]:
            branch["properties"]["parameters"] = {"type": "object"}
        return json.loads(json.dumps(schema))

    monkeypatch.setattr(gateway_tools, "required_schema", loose)


def template_drops_tool_calls(monkeypatch) -> None:
    """An assistant message's tool calls do not reach the chat template."""
    real = verifier_prompt._turn

    def turn(i, m):
        out = real(i, m)
        out.pop("tool_calls", None)
        return out

    monkeypatch.setattr(verifier_prompt, "_turn", turn)


def fp16_dot_rows_change_with_the_row_count(monkeypatch) -> None:
    """fp16-dot handing a call of several rows to another kernel (F.linear's MKL blocking on the
    same fp16 values): a row's bits then depend on how many rows share its call."""
    real = fp16_dot.product

    def by_row_count(x, packed, out_features, bias=None, avx2=False):
        if x.shape[0] == 1:
            return real(x, packed, out_features, bias, avx2)
        panels = packed.view(torch.float16)  # [N / panel, K, panel]
        weight = panels.transpose(1, 2).reshape(-1, x.shape[1])[:out_features].float()
        return torch.nn.functional.linear(x, weight, bias)

    monkeypatch.setattr(fp16_dot, "product", by_row_count)


def int8_dot_rows_change_with_the_row_count(monkeypatch) -> None:
    """int8-dot handing a call of several rows to F.linear on the dequantized weight (the same
    numbers, MKL's blocking): a row's bits then depend on how many rows share its call."""
    real = int8_dot.product

    def by_row_count(x, packed, scale, bias=None, avx2=False):
        if x.shape[0] == 1:
            return real(x, packed, scale, bias, avx2)
        q = packed.transpose(1, 2).reshape(-1, x.shape[1])[:scale.shape[0]]
        return torch.nn.functional.linear(x, int8_dot.dequantize(q, scale), bias)

    monkeypatch.setattr(int8_dot, "product", by_row_count)


def int8_scale_per_tensor(monkeypatch) -> None:
    """int8 quantization with one scale for the whole weight instead of one per output column:
    a column of small weights is rounded to a few levels (or to zero)."""
    def per_tensor(weight):
        w = weight.detach().to(torch.float32)
        scale = (w.abs().max() / 127).expand(w.shape[0]).contiguous()
        return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale

    monkeypatch.setattr(int8_dot, "quantize", per_tensor)


def cpu_step_rows_depend_on_the_row_count(monkeypatch) -> None:
    """The CPU step's norm hands a call of several rows to torch's operator and keeps the
    kernel for one row: a verified row's norm, and so its logits, differ from its decode's in
    the last bits."""
    from kernels import cpu_step

    real = cpu_step.add_rms

    def by_row_count(x, r, weight, eps):
        if x.shape[0] == 1:
            return real(x, r, weight, eps)
        x = x if r is None else x + r
        return x, torch.nn.functional.rms_norm(x, weight.shape, weight, eps)

    monkeypatch.setattr(cpu_step, "add_rms", by_row_count)


def policy_drops_prompt_lookups_shape(monkeypatch) -> None:
    """auto never weighs prompt lookup's shape: only ngram at the proposer's own range."""
    import gateway.policy as policy

    monkeypatch.setattr(policy, "shaped_candidates", lambda methods, req: ())


def policy_measures_the_shape_as_plain_ngram(monkeypatch) -> None:
    """The usage of a request run at prompt lookup's shape is counted as plain ngram's."""
    import gateway.frontend as frontend

    monkeypatch.setattr(frontend, "plan_candidate",
                        lambda plan: plan.method if plan.enabled else None)


def forced_draft_crosses_the_token_boundary(monkeypatch) -> None:
    """The grammar drafter keeps the forced text's last token even where a longer token starts
    with it and the target was never seen writing it alone there: the model's next token may
    cross the forced text's end, unchecked."""
    real = grammar_matcher.GrammarState.forced_tokens

    def unchecked(self, spell, k):
        def keep_all(text):
            ids, held = spell(text)
            return ids + ([held] if held is not None else []), None

        return real(self, keep_all, k)

    monkeypatch.setattr(grammar_matcher.GrammarState, "forced_tokens", unchecked)


def policy_prices_an_unmeasured_batch(monkeypatch) -> None:
    """The gateway takes every batch size as measured: a batch its replica never ran is priced
    on the curve of smaller steps (and a stack that measured nothing on the default curve)."""
    import gateway.estimates as estimates

    monkeypatch.setattr(estimates.Estimates, "cost_measured", lambda self, address, seqs: True)


def policy_explores_whatever_the_batch(monkeypatch) -> None:
    """An exploration turn drafts with the stale candidate whatever the batch makes of it."""
    import gateway.policy as policy

    def forced(self, stale, greedy, load, k_max, fixed_k, floors, cls):
        chosen, k, _ = self._choose((stale,), greedy, load, k_max, fixed_k, allow_off=False,
                                    floors=floors, cls=cls)
        return chosen, k

    monkeypatch.setattr(policy.SpeculationPolicy, "_exploration", forced)


def respelling_drops_the_rest(monkeypatch) -> None:
    """The grammar drafter learns a token the target wrote in pieces as the target's first
    piece alone: the rest of the token's text is lost from the forced draft."""
    real = forced_spelling.Spellings._vote

    def first_piece(self, before, token, spelling):
        real(self, before, token, spelling[:1] if len(spelling) > 1 else spelling)

    monkeypatch.setattr(forced_spelling.Spellings, "_vote", first_piece)


def step_costs_ignore_the_method(monkeypatch) -> None:
    """Every step is priced on its kind's curve, whatever the method that ran it measured alone
    (a gated chain's proposers drafting beside the forward charged to every chain)."""
    from splitspec import goodput

    original = goodput.StepCosts.of
    monkeypatch.setattr(goodput.StepCosts, "of",
                        lambda self, kind, seqs=None, method=None: original(self, kind, seqs))
