"""Draft-model and MLP-speculator proposers through real processes on 127.0.0.1: greedy output
equals speculation off for every k and in mixed batches, sampled output with each proposer (n-gram
included) and with a batch mixing proposers and k has the target's distribution, and seeded sampled
runs are reproducible.

The stack runs a sharpened copy of tests/fixtures/tiny-llama as target (see learned_testlib), a
noisy copy of it as draft and an MLP speculator fitted for a few seconds to the target's hidden
states, so that both proposers' drafts are sometimes accepted and sometimes rejected.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from statistics import NormalDist

import pytest
from learned_testlib import PROMPTS, gen_client, learned_stack_config
from stats_testlib import current

from splitspec.launcher import Stack, sibling_proposer_models
from splitspec.methods import METHODS, proposer_methods

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(learned_stack):
    return learned_stack


@pytest.fixture(scope="module")
def client(stack):
    with gen_client(stack) as c:
        yield c


@pytest.fixture(scope="module")
def baseline(client):
    return client.generate_all([client.request(p, None) for p in PROMPTS])


def ahead_hits(stack, method: str) -> int:
    """The verifier's count of drafts answered from the proposer's drafting ahead."""
    stats = current(stack.verifier.port)
    return sum(m.ahead_hits for m in stats.methods if m.method == method)


@pytest.mark.parametrize("method", ["draft", "mlp", "eagle"])
@pytest.mark.parametrize("k, branches", [(1, 1), (4, 1), (8, 1), (6, 2)])
def test_greedy_equals_speculation_off(stack, client, baseline, method, k, branches):
    """Drafting ahead is on by default: the draft proposer drafts ahead while the verifier verifies,
    and answers some steps from that (hits), each verified like any other draft; with token trees
    (branches > 1) too, drafted ahead and cut to the step's node count."""
    hits_before = ahead_hits(stack, method)
    results = client.generate_all([client.request(p, method, k, branches=branches)
                                   for p in PROMPTS])
    proposed = accepted = 0
    for base, res in zip(baseline, results):
        assert res.token_ids == base.token_ids and res.text == base.text
        spec = res.usage.speculation
        assert spec.method == method and spec.num_speculative_tokens == k
        assert 0 <= spec.accepted_tokens <= spec.proposed_tokens
        proposed += spec.proposed_tokens
        accepted += spec.accepted_tokens
    print(f"{method} k={k}: accepted {accepted} of {proposed} proposed")
    assert proposed > 0  # the proposer did draft (drafts reached verification)
    assert accepted > 0  # both proposers agree with the target often enough
    if METHODS[method].capabilities.drafts_ahead:
        assert ahead_hits(stack, method) > hits_before


# Hybrid drafts: a retrieval chain with a drafter across the wire, and with the in-target head
# (and gated: the model drafter only where retrieval found nothing)
HYBRIDS = ["hybrid:ngram+draft", "hybrid:suffix+eagle", "hybrid:ngram+mlp+eagle",
           "hybrid:suffix|eagle", "hybrid:ngram|draft"]


def test_hybrid_drafts_equal_speculation_off(client, baseline):
    """Each hybrid's components draft the same step (proposers over the wire and the in-target
    head together); their merged tree is verified in one forward: greedy output unchanged."""
    reqs = [client.request(p, m, k=6) for m in HYBRIDS for p in PROMPTS]
    results = client.generate_all(reqs, workers=8)
    for i, res in enumerate(results):
        assert res.token_ids == baseline[i % len(PROMPTS)].token_ids, reqs[i]
    for m in HYBRIDS:
        mine = [r.usage.speculation for r in results if r.usage.speculation.method == m]
        assert len(mine) == len(PROMPTS), m
        assert sum(s.accepted_tokens for s in mine) > 0, m


def test_a_mixed_batch_of_methods_equals_speculation_off(client, baseline):
    """ngram, draft, mlp and off requests in flight together share the verifier's steps."""
    methods = ["ngram", "draft", "mlp", None]
    reqs = [
        client.request(p, methods[(i + j) % 4], k=3)
        for i, p in enumerate(PROMPTS)
        for j in range(2)
    ]
    results = client.generate_all(reqs, workers=16)
    for i, _ in enumerate(PROMPTS):
        for j in range(2):
            assert results[2 * i + j].token_ids == baseline[i].token_ids


def test_seeded_sampled_runs_are_reproducible(client):
    reqs = [
        client.request(
            PROMPTS[i], method, k=4, temperature=0.8, top_p=0.95, seed=100 + i, max_tokens=12
        )
        for i in range(4)
        for method in ("draft", "mlp")
    ]
    first = client.generate_all(reqs)
    again = client.generate_all(reqs[::-1])[::-1]  # other batch partners and order
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    for method in ("draft", "mlp"):
        assert (
            sum(
                r.usage.speculation.proposed_tokens
                for r in first
                if r.usage.speculation.method == method
            )
            > 0
        )


# The distribution test compares every output position of a plan: the chance that any of them
# fails by luck alone is held at FAMILY_ALPHA per plan (Bonferroni over the positions). At
# 0.001 per position instead, the 45 comparisons of a run failed a correct sampler a few times
# in a hundred runs (positions share their prefixes, so one unlucky sample moves several).
FAMILY_ALPHA = 0.001
SAMPLED_POSITIONS = 9  # SAMPLED["max_tokens"]: a k = 8 draft at the first step and its bonus
POSITION_Z = NormalDist().inv_cdf(1.0 - FAMILY_ALPHA / SAMPLED_POSITIONS)  # 3.69


def chi2_critical(df: int, z: float = POSITION_Z) -> float:
    """Upper critical value of chi-square(df) at the normal quantile z (default: one position's
    share of FAMILY_ALPHA), by the Wilson-Hilferty approximation (within 1-2% of the exact value
    for df >= 3)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def two_sample_chi2(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, int]:
    """Chi-square statistic of "a and b are samples of one distribution" and its df.

    Tokens seen fewer than min_count times in both samples together share one pooled bin, so
    every expected count is >= min_count / 2. For equal sample sizes n, with pooled estimate
    p_i = (a_i + b_i) / 2n: stat = sum_i (a_i - b_i)^2 / (a_i + b_i), df = bins - 1.
    """
    bins: dict[object, list[int]] = {}
    for tok in set(a) | set(b):
        key = tok if a[tok] + b[tok] >= min_count else "pooled"
        cell = bins.setdefault(key, [0, 0])
        cell[0] += a[tok]
        cell[1] += b[tok]
    if bins.get("pooled", [0, 0]) != [0, 0] and sum(bins["pooled"]) < min_count:
        del bins["pooled"]  # too small to be its own bin: drop it from both (same n is kept
        # approximately; the loss is at most min_count samples out of hundreds)
    stat = sum((x - y) ** 2 / (x + y) for x, y in bins.values() if x + y > 0)
    return stat, max(len(bins) - 1, 1)


SAMPLED_N = 800  # requests per sample
# 9 tokens: a k = 8 draft at the first decoding step covers positions 0..7 and the bonus at 8
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "max_tokens": SAMPLED_POSITIONS}


@pytest.fixture(scope="module")
def sampled_prompt(client) -> str:
    """A prompt the n-gram proposer can draft from: a short prefix, the target's own greedy
    continuation of it, then the prefix again. The n-gram proposer matches the repeated prefix and
    proposes the continuation that followed it, tokens the target often (not always) samples, so
    both the accept and the reject paths of the sampler run."""
    prefix = "def add(a, b):"
    greedy = client.generate(client.request(prefix, None, max_tokens=12))
    return prefix + greedy.text + "\n" + prefix


def off_sample(client, prompt: str, n: int) -> list:
    """n seeded requests (seeds 20,000 + i) with speculation off."""
    return client.generate_all(
        [client.request(prompt, None, seed=20_000 + i, **SAMPLED) for i in range(n)], workers=8)


@pytest.fixture(scope="module")
def sampled_off(client, sampled_prompt) -> list:
    """The distribution tests' sample (soak tier): N seeded requests, speculation off."""
    return off_sample(client, sampled_prompt, SAMPLED_N)


SEEDED_N = 96  # requests per plan of the seeded comparison


@pytest.fixture(scope="module")
def seeded_off(client, sampled_prompt) -> list:
    """The seeded comparison's reference: its SEEDED_N requests with speculation off (the first
    SEEDED_N of sampled_off, drawn apart so that the default tier does not draw the rest)."""
    return off_sample(client, sampled_prompt, SEEDED_N)


# (method, k) of each request of a sample, cycled: one method and k, or a batch mixing all of them
SAMPLED_PLANS = {
    "ngram-k8": [("ngram", 8)],
    # the draft's sampled chains (k 8 and 2, drafting ahead on) are in "mixed", its sampled
    # second guesses in "trees": a sample of its own added 70 s to the suite and nothing else
    "mlp-k4": [("mlp", 4)],  # the test speculator has 4 heads
    # suffix drafts reach the sampler as n-gram's do (deterministic: one-hot q); its chains are
    # in "mixed" and its trees in "trees", and a sample of its own cost 17 s of the suite
    "lookahead-k8": [("lookahead", 8)],  # in-target: a tree of pool candidates and the window
    # in-target, sampled chains drawn from the head's own q (a step's chains drawn together)
    "eagle-k4": [("eagle", 4)],
    # with hybrid drafts: deterministic retrieval chains merged with sampled model chains (each
    # node its own drafter's q; sampled nodes never merged), across the wire and in the verifier
    "mixed": [("ngram", 1), ("draft", 8), ("mlp", 3), ("suffix", 6), ("draft", 2), ("mlp", 8),
              ("eagle", 4), ("hybrid:ngram+draft", 6), ("hybrid:suffix+eagle", 5),
              # gated: a step verifies the retrieval chain or the model's sampled chain
              ("hybrid:ngram|eagle", 5)],
    # token trees (method, k, children per node): deterministic siblings (n-gram, suffix) and
    # sampled ones (the draft's second guesses, the MLP's top-k per head) in one batch
    # (the draft's trees at k 5: its k 8 chains are in "mixed", and each tree node of its
    # second guesses is one more draft forward)
    "trees": [("ngram", 6, 3), ("draft", 5, 2), ("mlp", 4, 2), ("suffix", 6, 3),
              ("eagle", 6, 2), ("hybrid:suffix+mlp", 6, 2)],
}


def plan_request(client, prompt: str, step: tuple, **kw):
    """The request for one (method, k[, branches]) of a plan."""
    method, k, *branches = step
    return client.request(prompt, method, k, branches=branches[0] if branches else 1, **kw)


def draft_paths_ran(responses, methods) -> None:
    """Every method drafted, and the sampler both accepted and rejected: both paths ran."""
    proposed = accepted = 0
    for method in methods:
        mine = [r.usage.speculation for r in responses if r.usage.speculation.method == method]
        assert mine and sum(s.proposed_tokens for s in mine) > 0, method
        proposed += sum(s.proposed_tokens for s in mine)
        accepted += sum(s.accepted_tokens for s in mine)
    assert 0 < accepted < proposed, (accepted, proposed)


def prefix_cache_served(responses) -> None:
    """Prefix caching is on (the default): the prompt's full block came from the cache for
    most requests of a sample (the first of each prompt computes it). EAGLE's requests reuse
    one block fewer (its head's rows of a block need the next block): none of this prompt."""
    mine = [r for r in responses if r.usage.speculation.method != "eagle"]
    hits = sum(r.usage.cached_tokens > 0 for r in mine)
    assert hits >= len(mine) // 2, (hits, len(mine))


@pytest.mark.soak  # 800 requests per plan
@pytest.mark.parametrize("plan", list(SAMPLED_PLANS))
def test_sampled_speculation_has_the_targets_distribution(
    stack, client, sampled_prompt, sampled_off, plan
):
    """Distribution test, speculation on vs off (temperature 0.8, top_p 0.95), per proposer and
    for a batch that mixes proposers and k up to 8.

    N = 800 unseeded requests with speculation on (the rejection sampler's path) and N seeded ones
    with it off, each generating 9 tokens from the same prompt, so that a k = 8 draft and its
    bonus position are checked. For each output position the token histograms of the two samples
    are compared with a two-sample chi-square test (rare tokens pooled, see two_sample_chi2), the
    9 positions together at alpha = 0.001 (FAMILY_ALPHA). The marginal distribution of every
    position is the same under lossless speculation, so the test should pass; its power is
    checked by test_the_distribution_test_tells_temperatures_apart at the same critical values.
    """
    steps = SAMPLED_PLANS[plan]
    ahead = {m for m, *_ in steps if m in METHODS and METHODS[m].capabilities.drafts_ahead}
    hits_before = {m: ahead_hits(stack, m) for m in ahead}
    on = client.generate_all(
        [
            plan_request(client, sampled_prompt, steps[i % len(steps)], **SAMPLED)
            for i in range(SAMPLED_N)
        ],
        workers=8,
    )
    draft_paths_ran(on, {m for m, *_ in steps})
    prefix_cache_served(on)
    for m in ahead:  # drafting ahead on (the default): some drafts came from drafting ahead
        assert ahead_hits(stack, m) > hits_before[m], m
    for pos in range(SAMPLED["max_tokens"]):
        a = Counter(r.token_ids[pos] for r in on)
        b = Counter(r.token_ids[pos] for r in sampled_off)
        stat, df = two_sample_chi2(a, b)
        crit = chi2_critical(df)
        print(f"{plan} position {pos}: chi2 = {stat:.1f}, df = {df}, critical = {crit:.1f}")
        assert stat < crit, (pos, stat, df, a.most_common(8), b.most_common(8))


@pytest.mark.parametrize("plan", list(SAMPLED_PLANS))
def test_seeded_sampled_output_is_identical_with_speculation_on_and_off(
    client, sampled_prompt, seeded_off, plan
):
    """A seeded request's token at position t is argmax(p_t / E(seed, t)) whatever was drafted
    (kernels/rejection.py): with speculation on, any method, any k and any batch, it gives the
    very tokens it gives with speculation off."""
    steps = SAMPLED_PLANS[plan]
    on = client.generate_all(
        [
            plan_request(client, sampled_prompt, steps[i % len(steps)], seed=20_000 + i,
                         **SAMPLED)
            for i in range(SEEDED_N)
        ]
    )
    draft_paths_ran(on, {m for m, *_ in steps})
    prefix_cache_served(on)
    assert [r.token_ids for r in on] == [r.token_ids for r in seeded_off]


@pytest.mark.soak  # 800 more requests
def test_the_distribution_test_tells_temperatures_apart(client, sampled_prompt, sampled_off):
    """Power of the test above, checked on the spot: it tells temperature 0.8 from temperature
    1.0 (speculation off, N more requests), a smaller difference than a broken acceptance rule
    makes."""
    hotter = client.generate_all(
        [
            client.request(sampled_prompt, None, seed=30_000 + i, **{**SAMPLED, "temperature": 1.0})
            for i in range(SAMPLED_N)
        ],
        workers=8,
    )
    stat, df = two_sample_chi2(
        Counter(r.token_ids[0] for r in sampled_off), Counter(r.token_ids[0] for r in hotter)
    )
    print(
        f"power check, T=0.8 vs T=1.0 at position 0: chi2 = {stat:.1f}, df = {df}, "
        f"critical = {chi2_critical(df):.1f}"
    )
    assert stat > chi2_critical(df)


def test_up_finds_a_fitting_draft_and_speculator_next_to_the_target(stack, tiny_target_dir):
    """`splitspec up` starts the learned proposers by default when draft/ and mlp-speculator/
    sit next to the target and fit it; the module's stack uses that layout."""
    target = stack.config.model
    root = Path(target).parent
    assert sibling_proposer_models(target) == {
        "draft": str(root / "draft"),
        "mlp": str(root / "mlp-speculator"),
    }
    # tests/fixtures/tiny-llama's neighbours (if built) are for another vocabulary: not started with
    # it
    assert sibling_proposer_models(tiny_target_dir) == {}
    argv = stack.verifier.argv
    assert [argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--proposer"] == list(
        proposer_methods()
    )  # every registered proposer method, in registry order (in-target ones run inside)


SHIPPED = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.soak  # a second stack, of the shipped family (tests/models measures its acceptance)
@pytest.mark.skipif(
    not all((SHIPPED / d / "config.json").is_file() for d in ("target", "draft", "mlp-speculator")),
    reason="the trained models are not in models/ (make models)",
)
def test_shipped_proposers_are_lossless_and_accepted(tmp_path):
    """The trained target with its trained draft and speculator, as `splitspec up` runs them."""
    target = str(SHIPPED / "target")
    found = sibling_proposer_models(target)
    draft, spec = found.get("draft"), found.get("mlp")
    assert draft and spec
    with Stack(learned_stack_config(target, draft, spec, tmp_path)) as s, gen_client(s) as c:
        base = c.generate_all([c.request(p, None, max_tokens=32) for p in PROMPTS])
        for method in ("draft", "mlp"):
            res = c.generate_all([c.request(p, method, k=4, max_tokens=32) for p in PROMPTS])
            assert [r.token_ids for r in res] == [b.token_ids for b in base]
            proposed = sum(r.usage.speculation.proposed_tokens for r in res)
            accepted = sum(r.usage.speculation.accepted_tokens for r in res)
            print(f"shipped {method} k=4: accepted {accepted} of {proposed}")
            assert accepted > 0
