"""The EAGLE head's chain, tree and advance over static buffers (verifier_service/
methods/eagle/graphs.py), run eagerly here as they run before capture: the same tokens as the
head's own chain at every k and root, the same trees as its own at every shape and budget, sampled
chains with the same q (seeded: the same tokens) as its own sampled chain, the same cache and root
as its own advance at every width (padding rows included), nothing read back inside what a graph
records, and shapes past the buffers left to the eager code."""

from __future__ import annotations

import asyncio
import dataclasses

import planted_bugs as bug
import pytest
import torch
from capture_rules import GraphSafe
from eagle_testlib import PROMPT_TOKENS, eagle3_sequence, head_for_target, serve_eagle_beside_plain
from engine_testlib import drained, make_engine, request_ids, run_all

from kernels.eagle_tree import num_candidates
from splitspec.params import SamplingParams
from verifier_service.methods.eagle.graphs import EagleGraphs
from verifier_service.methods.in_target import InTargetDrafts

PROMPTS = [PROMPT_TOKENS, PROMPT_TOKENS[::-1], [7, 7, 7, 9, 11], PROMPT_TOKENS[3:] * 3]


def check_static_chains_match(max_k: int = 7) -> None:
    for prompt in PROMPTS:
        seq = eagle3_sequence(prompt)
        graphs = EagleGraphs(seq.head, capacity=64, max_k=max_k, capture=False)
        for k in range(1, max_k + 1):
            assert graphs.serves(seq, k)
            eager = seq.chain(k).tolist()
            assert graphs.chain(seq, k) == eager, (prompt, k)


def test_the_static_chain_drafts_what_the_heads_chain_drafts():
    check_static_chains_match()


def test_a_fed_row_blind_to_its_own_keys_fails_the_comparison(monkeypatch):
    bug.eagle_graph_row_blind_to_itself(monkeypatch)
    with pytest.raises(AssertionError):
        check_static_chains_match()


SAMPLING = [SamplingParams(temperature=0.8, seed=3),
            SamplingParams(temperature=1.0, top_k=10, top_p=0.9, seed=9),
            SamplingParams(temperature=0.7, min_p=0.05)]


def check_static_sampled_chains_match(k: int = 5) -> None:
    """Seeded chains: the head's very tokens and q rows. Unseeded: the same first q (the later
    ones follow the draws), each token in the q it was drawn from."""
    for prompt in PROMPTS[:2]:
        for params in SAMPLING:
            seq = eagle3_sequence(prompt)
            graphs = EagleGraphs(seq.head, capacity=64, max_k=8, capture=False, top_k=16)
            eager = seq.sampled_chain(k, params, len(prompt), 16)
            static = graphs.sampled_chain(seq, k, params, len(prompt))
            seeded = params.seed is not None
            if seeded:
                assert static.tokens == eager.tokens, (prompt, params)
            for (got_ids, got_p), (want_ids, want_p) in list(
                    zip(static.q.rows(), eager.q.rows()))[:k if seeded else 1]:
                assert list(got_ids) == list(want_ids)
                assert list(got_p) == pytest.approx(list(want_p), abs=1e-6)
            for token, (ids, probs) in zip(static.tokens, static.q.rows()):
                assert token in list(ids) and sum(probs) == pytest.approx(1.0, abs=1e-5)


def test_the_static_sampled_chain_draws_what_the_heads_sampled_chain_draws():
    check_static_sampled_chains_match()


def test_seeded_noise_keyed_one_position_off_fails_the_comparison(monkeypatch):
    bug.eagle_graph_sampled_keys_one_position_off(monkeypatch)
    with pytest.raises(AssertionError):
        check_static_sampled_chains_match()


TREE_SHAPES = [(2, 1), (2, 3), (3, 4), (4, 5), (3, 6)]  # (children per node, depth)


def check_static_trees_match() -> None:
    """Every budget's tree (its prefix of the best-first candidates): the head's own tree, node
    for node and parent for parent."""
    for prompt in PROMPTS:
        for top_k, depth in TREE_SHAPES:
            seq = eagle3_sequence(prompt)
            graphs = EagleGraphs(seq.head, capacity=96, max_k=8, capture=False)
            assert graphs.serves_tree(seq, top_k, depth)
            for budget in sorted({1, depth, 2 * depth, num_candidates(top_k, depth)}):
                eager = seq.draft_tree(top_k, depth, budget)
                static = graphs.tree(seq, top_k, depth, budget)
                assert (static.tokens, static.parents) == (eager.tokens, eager.parents), (
                    prompt, top_k, depth, budget)


def test_the_static_tree_drafts_what_the_heads_tree_drafts():
    check_static_trees_match()


def test_tree_rows_seeing_every_fed_row_fail_the_comparison(monkeypatch):
    bug.eagle_graph_tree_rows_see_every_fed_row(monkeypatch)
    with pytest.raises(AssertionError):
        check_static_trees_match()


ADVANCES = [3, 1, 9, 2, 5, 4]  # rows kept per step: every width of max_k 8, padded or not


def check_static_advance_matches() -> None:
    eager, static = eagle3_sequence(PROMPT_TOKENS), eagle3_sequence(PROMPT_TOKENS)
    graphs = EagleGraphs(static.head, capacity=64, max_k=8, capture=False)
    g = torch.Generator().manual_seed(3)
    for rows in ADVANCES:
        feats = torch.randn(rows, static.head.spec.feature_size, generator=g)
        tokens = torch.randint(0, 96, (rows,), generator=g)
        assert graphs.serves_advance(static, rows)
        eager.advance(feats, tokens)
        graphs.advance(static, feats, tokens)
        n = eager.length
        assert static.length == n
        torch.testing.assert_close(static.keys[:, :, :n], eager.keys[:, :, :n])
        torch.testing.assert_close(static.values[:, :, :n], eager.values[:, :, :n])
        torch.testing.assert_close(static.root_logits, eager.root_logits)
        assert int(static.root_token) == int(eager.root_token)
        assert static.chain(5).tolist() == eager.chain(5).tolist()


def test_the_static_advance_leaves_what_the_heads_advance_leaves():
    check_static_advance_matches()


def test_advanced_rows_seeing_later_rows_fail_the_comparison(monkeypatch):
    bug.eagle_graph_advance_rows_see_later_rows(monkeypatch)
    with pytest.raises(AssertionError):
        check_static_advance_matches()

def test_a_sequence_grown_by_the_static_advance_is_drafted_by_the_eager_loops_too():
    """Trees and the head's own chains write scratch columns into the buffer the static
    advance grew (which must not come out as an inference-mode tensor)."""
    seq = eagle3_sequence(PROMPT_TOKENS)  # capacity 64
    graphs = EagleGraphs(seq.head, capacity=256, max_k=8, capture=False)
    for _ in range(8):
        graphs.advance(seq, torch.randn(8, seq.head.spec.feature_size), torch.arange(8))
    assert seq.length == 74 and seq.capacity >= 74
    seq.tree(3, 4, 8)
    seq.chain(4)

def test_the_iteration_reads_nothing_back(monkeypatch):
    seq = eagle3_sequence(PROMPT_TOKENS)
    graphs = EagleGraphs(seq.head, capacity=64, max_k=4, capture=False)
    graphs.chain(seq, 4)  # the buffers hold a real root

    def no_list(self):
        raise AssertionError("tolist inside the captured iteration")

    monkeypatch.setattr(torch.Tensor, "tolist", no_list)
    graphs.advance(seq, torch.randn(3, seq.head.spec.feature_size), torch.tensor([4, 5, 6]))
    graphs.sampled_chain(seq, 3, SAMPLING[1], len(PROMPT_TOKENS))  # sampling inputs set
    with GraphSafe():
        graphs.iteration()
        graphs.iteration(sampled=True)
        graphs.tree_body(3, 4)
        graphs.advance_rows(4)
    with pytest.raises(AssertionError, match="host read"), GraphSafe():
        int(graphs.col)  # the mode itself catches a read


def check_chains_fed_from_the_device_verify_what_read_back_chains_verify(target_dir) -> None:
    """Greedy EAGLE chains held on the device are copied into the step's input there (ids and
    the verification's draft ids, StepPlan.draft_offsets): the output and every count of
    accepted drafts are those of the same chains read back first, batched with a plain
    request (the toy target and its trained head: drafts are accepted)."""
    def serve(hold: bool):
        engine = make_engine(target_dir, proposers={}, eagle=f"{target_dir}-eagle")
        method = engine.drafts.in_target.methods["eagle"]
        method.graphs = EagleGraphs(method.head, capacity=256, max_k=8, capture=False)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(EagleGraphs, "captured", property(lambda self: True))
            if not hold:  # the chain's ids read back with the step's other drafts
                real = EagleGraphs.pending_chain
                mp.setattr(EagleGraphs, "pending_chain", lambda self, seq, k: dataclasses.replace(
                    real(self, seq, k), ids=None))
            return serve_eagle_beside_plain(engine)

    held, read = serve(True), serve(False)
    assert held == read and held[1][0] > 0


def test_chains_fed_from_the_device_verify_what_read_back_chains_verify(target_model_dir):
    check_chains_fed_from_the_device_verify_what_read_back_chains_verify(target_model_dir)


def test_device_ids_copied_one_row_off_fail_the_comparison(monkeypatch, target_model_dir):
    bug.device_draft_ids_one_row_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_chains_fed_from_the_device_verify_what_read_back_chains_verify(target_model_dir)


def check_batched_pending_drafts_match_each_alone() -> None:
    """A step's sequences draft one after another through the same static buffers and their
    drafts come back together (InTargetDrafts): each must be the one it drafts alone."""
    seqs = [eagle3_sequence(PROMPT_TOKENS), eagle3_sequence([40, 21, 33, 7, 9, 11] * 2)]
    graphs = EagleGraphs(seqs[0].head, capacity=64, max_k=4, capture=False)
    alone = [graphs.chain(s, 4) for s in seqs] + [graphs.tree(s, 2, 3, 6) for s in seqs]
    assert alone[0] != alone[1]  # different drafts, or the comparison proves nothing
    pending = [graphs.pending_chain(s, 4) for s in seqs]
    pending += [graphs.pending_tree(s, 2, 3, 6) for s in seqs]
    together = InTargetDrafts({})._resolve(dict(enumerate(pending)))
    assert together[0] == alone[0] and together[1] == alone[1]
    for got, want in zip((together[2], together[3]), alone[2:]):
        assert (got.tokens, got.parents) == (want.tokens, want.parents)


def test_a_steps_drafts_read_back_together_are_each_sequences_own():
    check_batched_pending_drafts_match_each_alone()


def test_drafts_left_in_the_shared_buffer_fail_the_comparison(monkeypatch):
    bug.eagle_pending_chain_not_copied_out(monkeypatch)
    with pytest.raises(AssertionError):
        check_batched_pending_drafts_match_each_alone()


def test_the_check_catches_a_host_value_copied_into_the_tree(monkeypatch):
    bug.eagle_tree_mask_written_from_host(monkeypatch)
    seq = eagle3_sequence(PROMPT_TOKENS)
    graphs = EagleGraphs(seq.head, capacity=64, max_k=4, capture=False)
    graphs.chain(seq, 4)
    with pytest.raises(AssertionError, match="host value copied in"), GraphSafe():
        graphs.tree_body(3, 4)
    with pytest.raises(AssertionError, match="host value copied in"), GraphSafe():
        seq.tree(3, 4, 8)


def test_shapes_past_the_buffers_are_left_to_the_eager_code():
    seq = eagle3_sequence(PROMPT_TOKENS)  # 10 columns with target features
    graphs = EagleGraphs(seq.head, capacity=12, max_k=8, capture=False)
    assert graphs.serves_tree(seq, 2, 2) and not graphs.serves_tree(seq, 3, 2)  # 10..12
    assert graphs.serves(seq, 3)  # writes columns 10 and 11
    assert not graphs.serves(seq, 4)  # column 12 is past the capacity
    assert not graphs.serves(seq, 9) and not graphs.serves(seq, 0)
    assert graphs.widths == (1, 2, 4, 8, 9)
    assert graphs.serves_advance(seq, 2)  # width 2: columns 10, 11
    assert not graphs.serves_advance(seq, 3)  # width 4 would write columns 12, 13
    wide = EagleGraphs(seq.head, capacity=64, max_k=8, capture=False)
    assert wide.serves_advance(seq, 9) and not wide.serves_advance(seq, 10)  # a prefill chunk
    assert not EagleGraphs(seq.head, 64, 8).captured  # no graphs on this device
    assert not EagleGraphs(seq.head, 64, 8).captured_advance(1)


def test_the_heads_own_loops_read_nothing_back_until_the_draft_is_handed_over():
    """As methods/eagle/head.py promises for its eager chain and tree (an indexing of the draft
    vocabulary by a 0-d tensor was such a read, once per drafted token)."""
    seq = eagle3_sequence(PROMPT_TOKENS)
    with GraphSafe():
        seq.chain(5)
        seq.tree(3, 4, 8)


@pytest.mark.parametrize("version", [3, 1])
def test_greedy_output_through_the_static_chain_equals_speculation_off(
        monkeypatch, tiny_target_dir, tmp_path, version):
    """The engine's wiring: captured chains and advances (run eagerly here) serve greedy chain
    requests, batched with a plain one, and the output is speculation off's."""
    head = str(head_for_target(tmp_path, tiny_target_dir, version))
    prompts = [PROMPT_TOKENS * 2, [100, 200, 300, 7, 9, 11] * 3, list(range(40, 70))]

    def serve(engine, inputs):
        return [t for t, _, _ in asyncio.run(run_all(engine, inputs))]

    off = serve(make_engine(tiny_target_dir, proposers={}),
                [request_ids(f"o{i}", p, max_tokens=24) for i, p in enumerate(prompts)])
    engine = make_engine(tiny_target_dir, proposers={}, eagle=head)
    method = engine.drafts.in_target.methods["eagle"]
    method.graphs = EagleGraphs(method.head, capacity=128, max_k=8, capture=False)
    monkeypatch.setattr(EagleGraphs, "captured", property(lambda self: True))
    monkeypatch.setattr(EagleGraphs, "captured_advance", lambda self, rows: True)
    on = serve(engine, [request_ids("a", prompts[0], max_tokens=24, method="eagle", k=4),
                        request_ids("b", prompts[1], max_tokens=24, method="eagle", k=6),
                        request_ids("plain", prompts[2], max_tokens=24)])
    assert on == off
    c = method.counters
    assert c["graph_chains_total"] > 0 and c["eager_chains_total"] == 0
    # the kept rows of every step through the graph; the prompts' prefill (wider) eagerly
    assert c["graph_advances_total"] > 0 and c["eager_advances_total"] == 2
    assert drained(engine)
