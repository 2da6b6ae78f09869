"""bench/specbench.py's report: Spec-Bench's table layout (a row per configuration, a column per
group, #MAT, overall) against both baselines, the greedy check against off, acceptance, and
Spec-Bench's published Vicuna-7B rows beside it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import specbench_speed as speed
from bench_common import markdown_table, write_markdown
from specbench_cost import StepSplit
from specbench_data import GROUPS
from specbench_published import DEVICES, SOURCE, VICUNA_7B
from specbench_speed import Answer

HF = "HF plain"
OFF = "off"


def by_group(answers: list[Answer]) -> dict[str, list[Answer]]:
    """Each group's answers, and "overall": every answer."""
    out = {g: [a for a in answers if a.group == g] for g in GROUPS}
    return {**{g: v for g, v in out.items() if v}, "overall": list(answers)}


def mismatches(answers: list[Answer], reference: list[Answer]) -> list[str]:
    """Each (question, turn) whose token ids differ from the reference's: where and how."""
    ref = {a.question_id: a for a in reference}
    out = []
    for a in answers:
        for i, (t, r) in enumerate(zip(a.turns, ref[a.question_id].turns)):
            if t.ids != r.ids:
                at = next((j for j, (x, y) in enumerate(zip(t.ids, r.ids)) if x != y),
                          min(len(t.ids), len(r.ids)))
                out.append(f"question {a.question_id} ({a.group}) turn {i + 1}: first differs "
                           f"at token {at} ({len(t.ids)} vs {len(r.ids)} tokens)")
    return out


def same_column(label: str, answers: list[Answer], off: list[Answer] | None) -> str:
    if off is None:
        return "-"
    if label == OFF:
        return "(reference)"
    bad = mismatches(answers, off)
    turns = sum(len(a.turns) for a in answers)
    if label == HF:
        return ("same" if not bad else f"{len(bad)} of {turns} differ (other kernels; "
                "not a lossless check)")
    return "yes" if not bad else f"**NO: {len(bad)} of {turns} answers differ**"


def speedup_rows(answers: dict[str, list[Answer]], base: list[Answer],
                 groups: list[str]) -> list[list[object]]:
    rows = []
    off = answers.get(OFF)
    for label, mine in answers.items():
        g_mine, g_base = by_group(mine), by_group(base)
        cells = [f"{speed.speedup(g_mine[g], g_base[g]):.2f}x" for g in groups]
        rows.append([label, *cells, f"{speed.mean_accepted_tokens(mine):.2f}",
                     f"**{speed.speedup(mine, base):.2f}x**", same_column(label, mine, off)])
    return rows


def write_report(out: Path, result: dict, args, echo: bool = True) -> None:
    """The report of what the results file holds (bench/specbench_results.py's gather):
    marked partial while units are pending; printed too when `echo`."""
    answers: dict[str, list[Answer]] = result["answers"]
    questions = result["questions"]
    groups = [g for g in GROUPS if any(q.group == g for q in questions)]
    heads = [GROUPS[g] for g in groups]
    per_group = Counter(q.group for q in questions)
    smoke = args.smoke or args.max_new_tokens < 64
    sessions = result.get("sessions") or []
    facts = sessions[0]["facts"] if sessions else {}
    lines = [f"# Spec-Bench on `{Path(args.model).name}`" + (" (SMOKE RUN)" if smoke else "")
             + (" (PARTIAL)" if result["pending"] else ""), ""]
    if result["pending"]:
        lines += [f"**Partial: {len(result['pending'])} of the run's units not (yet) measured: "
                  + ", ".join(result["pending"]) + "**. The run is still going, or it stopped: "
                  "the same command with `--resume` runs only these (the results file, "
                  f"`{Path(args.results).name}`, holds the rest).", ""]
    if smoke:
        lines += ["**A smoke run: it proves the harness end to end; its numbers say nothing "
                  f"about speed** ({args.max_new_tokens} tokens per answer).", ""]
    lines += [
        f"{len(questions)} Spec-Bench questions ("
        + ", ".join(f"{GROUPS[g]} {per_group[g]}" for g in groups)
        + f"; {sum(len(q.turns) for q in questions)} turns) from "
        "bench/data/spec_bench/question.jsonl, each through the model's chat template (MT-bench's "
        "second turn after the configuration's own first answer), greedy, batch 1, each answer "
        f"until EOS or {args.max_new_tokens} new tokens. Every system answers the same prompt "
        "ids; " + ("one stack served every splitspec configuration in turn" if args.shared_stack
                   else "each splitspec configuration in a stack of its own, started for it")
        + ". Produced by "
        "`python bench/specbench.py` (`make bench-specbench`).", ""]
    lines += markdown_table({"machine": "l", "": "l"}, [[k, v] for k, v in facts.items()])
    lines += [""] + sessions_section(sessions)
    speed_note = (
        "Speed-up as Spec-Bench's evaluation/speed.py computes it: per question, tokens/s = its "
        "new tokens (all turns) over its wall time (all turns, each from the request to its "
        "last token: prefill included); per group, the **ratio of the means** of those per-"
        "question rates (mean over the group's questions of the configuration's tok/s, over "
        "the same mean of the baseline's), not a mean of per-question ratios; overall: the "
        "same over every question. #MAT: tokens emitted per target forward, every step of "
        "every answer pooled (Spec-Bench's mean accepted tokens; 1.00 without speculation).")
    cols = {"configuration": "l", **{h: "r" for h in heads}, "#MAT": "r", "overall": "r",
            "greedy = off": "l"}
    if HF in answers:
        lines += ["## Speed-up against Hugging Face `generate` (Spec-Bench's baseline)", "",
                  speed_note, ""]
        lines += markdown_table(cols, speedup_rows(answers, answers[HF], groups)) + [""]
    if OFF in answers:
        lines += ["## Speed-up against splitspec with speculation off", ""]
        lines += markdown_table(cols, speedup_rows(answers, answers[OFF], groups)) + [""]
    if result.get("repeat_label") and not args.shared_stack:
        lines += [f"The row *{result['repeat_label']}* is not a configuration: its stack had "
                  "already answered the same questions once (its first pass is the row above "
                  "it), which a cross-request method (suffix) drafts back; the other rows each "
                  "ran on a stack that had seen none of them.", ""]
    lines += ["## Tokens per second (mean over questions), #MAT and first-position "
              "acceptance per group", "",
              "Each cell: tok/s / #MAT / first-position acceptance (of the steps that verified "
              "a draft, the share whose first draft token was accepted; - without drafts).", ""]
    rows = []
    for label, mine in answers.items():
        cells = []
        for ans in by_group(mine).values():
            fpa = speed.first_position_acceptance(ans)
            cells.append(f"{speed.mean_tok_s(ans):.1f} / {speed.mean_accepted_tokens(ans):.2f} / "
                         + ("-" if fpa is None else f"{fpa:.2f}"))
        rows.append([label, *cells])
    lines += markdown_table({"configuration": "l", **{h: "r" for h in heads}, "overall": "r"},
                            rows) + [""]
    lines += cost_section(result.get("cost", {}))
    auto = {label: a for label, a in answers.items() if label.startswith("auto")}
    for label, mine in auto.items():
        lines += [auto_line(label, mine), ""]
    lines += mismatch_section(answers)
    if result["seeded"]:
        lines += seeded_section(result["seeded"], args)
    if result["skipped"]:
        lines += ["Not run: " + "; ".join(f"{k} ({v})" for k, v in result["skipped"].items())
                  + ".", ""]
    lines += published_section()
    lines += ["## Wall time of each pass", ""]
    lines += markdown_table({"system": "l", "seconds": "r"},
                            [[k, f"{v:.0f}"] for k, v in result["timing"].items()]
                            + [["whole run: every row's unit, summed (its stack's start and "
                                "stop included)",
                                f"{result.get('wall_s', 0):.0f}"]]) + [""]
    lines += notes(args)
    if args.shared_stack:
        lines[2:2] = ["**One stack served every configuration in turn (--shared-stack)**: a "
                      "check of the harness, not a measurement (a cross-request method drafts "
                      "the answers of the configurations before it).", ""]
    if echo:
        write_markdown(out, lines)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")


def auto_line(label: str, answers: list[Answer]) -> str:
    """What an auto configuration ran, per answer, and why: its policy's reasons counted
    (usage.speculation.policy_reason; absent from results taken before it was recorded)."""
    turns = [t for a in answers for t in a.turns]
    chose = Counter(t.method or "off" for t in turns)
    why = Counter(t.policy_reason for t in turns if t.policy_reason)
    return (f"What `{label}` ran, per answer: "
            + ", ".join(f"{m} x{n}" for m, n in chose.most_common())
            + ("; the policy's reasons (policy_reason): "
               + ", ".join(f"{r} x{n}" for r, n in why.most_common()) if why else "") + ".")


def sessions_section(sessions: list[dict]) -> list[str]:
    """Where the rows came from when more than one run measured them (--resume): each run's
    start, commit, load and rows; the machine table above is the first run's."""
    if len(sessions) < 2:
        return []
    commits = {s["commit"] for s in sessions}
    lines = ["## Measured over several runs (--resume)", "",
             f"These rows come from {len(sessions)} runs of the harness, continued with "
             "`--resume` (the same questions, answer lengths and threads; the machine table "
             "above is the first run's)"
             + (f"; **at {len(commits)} different commits**" if len(commits) > 1 else
                f", all at commit {next(iter(commits))}") + ".", ""]
    rows = [[s["started"], s["commit"],
             s["facts"].get("load average (1/5/15 min) at start", "n/a"), ", ".join(s["rows"])]
            for s in sessions]
    return lines + markdown_table({"run started (UTC)": "l", "commit": "l",
                                   "load average at start": "l", "rows": "l"}, rows) + [""]


def cost_rows(costs: dict[str, StepSplit]) -> list[list[object]]:
    """A row per configuration: ms per step and its split, tokens per step and per token, and
    its decoding steps by kind (chains, trees)."""
    def kind(c: StepSplit, name: str) -> str:
        k = c.kind(name)
        return "-" if k is None else f"{k[0]:.0%} / {k[1]:.1f} / {k[2]:.1f}"

    rows = []
    for label, c in costs.items():
        per_token = c.per_step_ms / c.tokens_per_step if c.tokens_per_step else 0.0
        rows.append([label, c.steps, f"{c.per_step_ms:.1f}", f"{c.draft_ms:.1f}",
                     f"{c.verify_ms:.1f}", f"{c.prefill_ms:.1f}", f"{c.rest_ms:.1f}",
                     f"{c.tokens_per_step:.2f}",
                     f"{per_token:.1f}", kind(c, "greedy"), kind(c, "tree")])
    return rows


def cost_section(costs: dict[str, StepSplit]) -> list[str]:
    if not costs:
        return []
    lines = ["## Where a step's time goes", "",
             "Per configuration, over its timed pass (bench/specbench_cost.py reads the stack's "
             "own counters around it: the verifier's /metrics and WatchStats, no timer added): "
             "milliseconds per engine step of the client's wall time, split (each part over "
             "every engine step, so they add up) into **drafting** (the step's wait for its "
             "methods' drafts: a proposer's round trip, an in-target head's drafting and its "
             "learning from the last step), **verify** (the decoding steps' rest: the target's "
             "forward, the sampler, bookkeeping), **prefill** (the prompts' steps) and "
             "**rest** (the client's time outside engine steps: gateway, gRPC, streaming, the "
             "gaps between steps); tokens per step (every answer's tokens over "
             "the engine's steps), milliseconds per token; and the decoding steps by kind, each "
             "cell share of steps / mean rows fed / mean verify ms: chains (verified inside the "
             "forward, greedy) and token trees (the tree sampler after the forward). A "
             "configuration beats off where its ms per token is below off's: tokens per step "
             "must pay for the drafting and the wider verify.", ""]
    lines += markdown_table({"configuration": "l", "steps": "r", "ms / step": "r",
                             "drafting": "r", "verify": "r", "prefill": "r", "rest": "r",
                             "tokens / step": "r", "ms / token": "r", "chain steps": "r",
                             "tree steps": "r"}, cost_rows(costs))
    return lines + [""]


def mismatch_section(answers: dict[str, list[Answer]]) -> list[str]:
    off = answers.get(OFF)
    if off is None:
        return []
    bad = {label: mismatches(mine, off) for label, mine in answers.items()
           if label not in (OFF, HF)}
    bad = {k: v for k, v in bad.items() if v}
    if not bad:
        return ["Every greedy answer of every splitspec configuration is identical, token for "
                "token, to speculation off's.", ""]
    lines = ["## GREEDY OUTPUT DIFFERS FROM OFF", "",
             "**Lossless decoding is broken: these answers differ from speculation off's.**", ""]
    for label, items in bad.items():
        lines += [f"- **{label}**: " + "; ".join(items)]
    return lines + [""]


def seeded_section(seeded: dict[str, dict[int, list]], args) -> list[str]:
    ref = seeded.get(OFF, {})
    rows = []
    for label, answers in seeded.items():
        if label == OFF:
            continue
        same = sum(answers[q] == ref.get(q) for q in answers)
        rows.append([label, f"{same} of {len(answers)}",
                     "yes" if same == len(answers) else "**NO**"])
    return (["## Seeded sampling: identical on and off", "",
             f"Temperature 0.8, seed {args.seed} + question id, the questions of "
             f"{', '.join(GROUPS[g] for g in args.seeded)}, each answer until EOS or "
             f"{args.seeded_max_new_tokens} new tokens (--seeded-max-new-tokens; untimed, after "
             "each configuration's greedy pass): every turn's token ids against speculation "
             "off's.", ""]
            + markdown_table({"configuration": "l", "questions identical": "r", "all": "l"},
                             rows) + [""])


def published_section() -> list[str]:
    lines = ["## Published: Spec-Bench's Vicuna-7B rows (another model, on another device)", "",
             f"From {SOURCE}. **Not comparable cell by cell**: Vicuna-7B-v1.3 in FP16 on a GPU, "
             "against Hugging Face plain decoding of the same model there; the rows above are a "
             "135M-parameter model on this CPU. They show what the field reports per group.", ""]
    cols = {"method": "l", **{h: "r" for h in GROUPS.values()}, "#MAT": "r", "overall": "r"}
    for device, rows in VICUNA_7B.items():
        lines += [f"{device}: {DEVICES[device]}.", ""]
        lines += markdown_table(cols, [[name, *(f"{v:.2f}x" for v in cells[:6]),
                                        f"{cells[6]:.2f}", f"{cells[7]:.2f}x"]
                                       for name, *cells in rows]) + [""]
    return lines


def notes(args) -> list[str]:
    return [
        "## Notes", "",
        "- Spec-Bench counts its baseline's tokens by tokenizing the answer text again; here "
        "every system counts the token ids it generated (EOS included when it stopped there), "
        "which are the same ids wherever the answers are identical.",
        "- Wall time is the client's: for splitspec, from sending the request to the gRPC "
        "front door to its stream's last message (gateway, verifier, proposers; prompt ids "
        "sent, so no tokenizing); for Hugging Face, the `generate` call. Prompts are rendered "
        "and tokenized before the clock starts, as in Spec-Bench.",
        "- Threads: " + ("the defaults a user gets (torch's in HF, the stack's in each "
                         "service: splitspec/launcher/threads.py; the machine table says how "
                         "many)" if not (args.threads or args.proposer_threads) else
                         f"{args.threads or 'default'} for the target in HF and in the "
                         f"verifier, {args.proposer_threads or 'default'} per proposer")
        + "; every stack's verifier has "
        f"--max-num-speculative-tokens {args.max_k}.",
        "- Each configuration's stack answers two warm-up requests (a prompt with nothing to "
        "copy) before its timed pass.",
        "- The verifier's prefix cache is on (its default): an MT-bench second turn reuses its "
        "first turn's prompt blocks, the warm-up leaves the chat template's opening cached (alike "
        "for every configuration), and the repeated-question row finds its prompts cached "
        "whole; Hugging Face computes every prompt afresh.",
        "- Spec-Bench runs 1024 new tokens per answer on GPUs; this run's limit is "
        f"{args.max_new_tokens} (--max-new-tokens).", ""]
