"""Training and held-out data for EAGLE heads (scripts/train_eagle.py): the target's own greedy
answers with its features at every position.

A record is one answer:
    tokens     int32 [L]          the prompt (as the verifier feeds it) then the target's answer
    prompt_len int                tokens before the answer
    feats      fp16 [L - 1, 3, H] the residual-stream inputs of the three feature layers at every
                                  position but the last (what the verifier hands an EAGLE-3 head)
    top_ids    int32 [L - 1, K]   the target's K most likely next tokens after each position ...
    top_logp   fp16 [L - 1, K]    ... and their log-probabilities (soft labels)
    final      fp16 [L - 1, H]    held-out records only: the final-norm hidden state (what the MLP
                                  speculator is conditioned on, to compare it on the same answers)
    kind, part, category          "chat"/"code", "train"/"val", the request's category

Requests for the chat model are written by the model itself (`write_requests`: a category's
instruction and two worked examples as earlier chat turns, a topic, sampled), never taken from a
hub; `overlaps` keeps any that shares a long word sequence with the held-out set out.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import torch

# a request sharing this many consecutive words with a held-out prompt is dropped (fewer would
# catch the phrasing every request shares, "write a python function that returns the")
WORD_NGRAM = 8


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = WORD_NGRAM) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def overlaps(prompt: str, heldout: list[str], n: int = WORD_NGRAM) -> bool:
    """Whether `prompt` shares n consecutive words with any held-out prompt, or, when it has
    fewer words, appears word for word inside one (either way round)."""
    mine, words = ngrams(prompt, n), " ".join(_words(prompt))
    for h in heldout:
        theirs = " ".join(_words(h))
        if (mine & ngrams(h, n) or (len(_words(prompt)) < n and f" {words} " in f" {theirs} ")
                or (len(_words(h)) < n and f" {theirs} " in f" {words} ")):
            return True
    return False


# -- requests written by the model ---------------------------------------------------------------

def _conversation(category, topic: str) -> list[dict]:
    conv = []
    for example_topic, request in category.examples:
        conv += [{"role": "user", "content": category.instruction.format(topic=example_topic)},
                 {"role": "assistant", "content": request}]
    conv.append({"role": "user", "content": category.instruction.format(topic=topic)})
    return conv


def clean_request(text: str) -> str | None:
    """The request the model wrote, or None when it wrote something else (too short, too long,
    a list, or the example format's labels)."""
    text = text.strip().strip('"').strip()
    text = text.split("\n\n")[0].strip()
    if "\n" in text and not any(c in text for c in ":`"):
        text = text.split("\n")[0].strip()
    if not 12 <= len(text) <= 400 or text.lower().startswith(("sure", "here is", "here's")):
        return None
    return text


@torch.no_grad()
def _sample_after_prefix(model, prefix: list[int], suffixes: list[list[int]], n_new: int,
                         stop: set[int], gen: torch.Generator, temperature: float,
                         top_p: float) -> list[list[int]]:
    """Sampled continuations of prefix + suffix_i, the shared prefix's keys and values computed
    once (the instruction's worked examples are most of each prompt)."""
    B, P = len(suffixes), len(prefix)
    out = model.model(input_ids=torch.tensor([prefix]), use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(B)
    S = max(len(s) for s in suffixes)
    ids = torch.zeros(B, S, dtype=torch.long)
    mask = torch.zeros(B, P + S, dtype=torch.long)
    mask[:, :P] = 1
    for i, s in enumerate(suffixes):  # left-padded inside the suffix segment
        ids[i, S - len(s):] = torch.tensor(s)
        mask[i, P + S - len(s):] = 1
    pos = (mask.cumsum(1) - 1)[:, P:]
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                      past_key_values=cache, use_cache=True)
    done = torch.zeros(B, dtype=torch.bool)
    toks = []
    for _ in range(n_new):
        logits = model.lm_head(out.last_hidden_state[:, -1]).float() / temperature
        probs = logits.softmax(-1)
        sp, si = probs.sort(-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p  # nucleus
        sp = sp * keep
        nxt = si.gather(1, torch.multinomial(sp, 1, generator=gen))  # [B, 1]
        toks.append(nxt)
        done |= torch.isin(nxt[:, 0], torch.tensor(sorted(stop)))
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], 1)
        pos = pos[:, -1:] + 1
        out = model.model(input_ids=nxt, attention_mask=mask, position_ids=pos,
                          past_key_values=out.past_key_values, use_cache=True)
    rows = torch.cat(toks, 1).tolist()
    return [r[:next((j for j, t in enumerate(r) if t in stop), len(r))] for r in rows]


def write_requests(model, tok, categories, heldout: list[str], per_pair: int, seed: int,
                   minutes: float, log, batch: int = 32, n_new: int = 48) -> list[dict]:
    """The chat model writes user requests: per_pair samples for every (category, topic) pair,
    category by category (their worked examples are one shared prefix), kept when clean, new
    and clear of the held-out set. Stops at the wall-clock cap."""
    gen = torch.Generator().manual_seed(seed)
    stop = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    out, seen, dropped, t0 = [], set(), {"unclean": 0, "duplicate": 0, "heldout": 0}, time.time()
    jobs = [(c, t) for c in categories for t in c.topics for _ in range(per_pair * c.weight)]
    random.Random(seed).shuffle(jobs)
    by_cat: dict[str, list] = {}
    for c, t in jobs:
        by_cat.setdefault(c.name, []).append((c, t))
    # interleave categories batch by batch, so a wall-clock cap leaves a balanced mix
    queues = [[q[i:i + batch] for i in range(0, len(q), batch)] for q in by_cat.values()]
    order = [b for group in zip(*[q + [None] * (max(map(len, queues)) - len(q)) for q in queues])
             for b in group if b]
    for chunk in order:
        c = chunk[0][0]
        convs = [tok.apply_chat_template(_conversation(c, t), tokenize=False,
                                         add_generation_prompt=True) for _, t in chunk]
        full = [tok(x, add_special_tokens=False).input_ids for x in convs]
        p = 0  # longest common prefix
        while all(p < len(f) for f in full) and len({f[p] for f in full}) == 1:
            p += 1
        p = min(p, min(len(f) for f in full) - 1)
        rows = _sample_after_prefix(model, full[0][:p], [f[p:] for f in full], n_new, stop, gen,
                                    temperature=0.8, top_p=0.95)
        for (cat, topic), r in zip(chunk, rows):
            text = clean_request(tok.decode(r, skip_special_tokens=True))
            key = " ".join(_words(text or ""))
            if text is None:
                dropped["unclean"] += 1
            elif key in seen:
                dropped["duplicate"] += 1
            elif overlaps(text, heldout):
                dropped["heldout"] += 1
            else:
                seen.add(key)
                out.append({"category": cat.name, "kind": cat.kind, "topic": topic,
                            "prompt": text})
        log(f"prompts: {len(out)} requests written, dropped {dropped}, "
            f"{(time.time() - t0) / 60:.1f} min")
        if time.time() - t0 > minutes * 60:
            log(f"prompts: wall-clock cap of {minutes} min reached")
            break
    return out


# -- the target's answers and features -----------------------------------------------------------

class FeatureTap:
    """Records the residual-stream input of chosen decoder layers on every forward (forward
    pre-hooks: the hidden state a layer receives is the residual stream itself)."""

    def __init__(self, model, layer_ids: list[int]):
        self.layer_ids = list(layer_ids)
        self.seen: list[torch.Tensor | None] = [None] * len(layer_ids)
        layers = model.model.layers
        self.handles = [layers[i].register_forward_pre_hook(self._hook(j), with_kwargs=True)
                        for j, i in enumerate(self.layer_ids)]

    def _hook(self, j: int):
        def hook(module, args, kwargs):
            self.seen[j] = args[0] if args else kwargs["hidden_states"]
        return hook

    def take(self) -> torch.Tensor:
        """[B, T, 3, H] of the last forward."""
        return torch.stack(self.seen, 2)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def greedy_with_features(model, ids: torch.Tensor, mask: torch.Tensor, n_new: int,
                         layer_ids: list[int], top_k: int, stop: set[int]):
    """Greedy decoding (what greedy verification accepts) that keeps, at every position, the three
    layers' inputs, the final-norm state and the target's top_k next-token log-probabilities,
    without a second pass. ids/mask [B, P] left-padded. Stops early once every row has said a
    stop token. Returns tokens [B, P + n], feats [B, P + n - 1, 3, H], final [B, P + n - 1, H],
    top_ids / top_logp [B, P + n - 1, K]."""
    tap = FeatureTap(model, layer_ids)
    try:
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        feats, finals, tops_i, tops_p, toks = [], [], [], [], [ids]
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        stop_t = torch.tensor(sorted(stop))
        for step in range(n_new):
            h = out.last_hidden_state
            logp = model.lm_head(h).float().log_softmax(-1)
            top = logp.topk(top_k, -1)
            feats.append(tap.take().to(torch.float16))
            finals.append(h.to(torch.float16))
            tops_i.append(top.indices.to(torch.int32))
            tops_p.append(top.values.to(torch.float16))
            nxt = top.indices[:, -1, :1]  # [B, 1] argmax
            toks.append(nxt)
            done |= torch.isin(nxt[:, 0], stop_t)
            if step == n_new - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
            pos = pos[:, -1:] + 1
            out = model.model(input_ids=nxt, attention_mask=mask, position_ids=pos,
                              past_key_values=out.past_key_values, use_cache=True)
    finally:
        tap.close()
    return (torch.cat(toks, 1), torch.cat(feats, 1), torch.cat(finals, 1),
            torch.cat(tops_i, 1), torch.cat(tops_p, 1))


def records_from_batch(batch_meta: list[dict], mask: torch.Tensor, result, stop: set[int],
                       keep_final: bool) -> list[dict]:
    """Cut a batch's left padding and everything after each answer's first stop token."""
    tokens, feats, final, top_i, top_p = result
    P = mask.shape[1]
    out = []
    for j, meta in enumerate(batch_meta):
        pad = int((mask[j] == 0).sum())
        ans = tokens[j, P:].tolist()
        end = P + next((i + 1 for i, t in enumerate(ans) if t in stop), len(ans))
        rec = dict(meta, tokens=tokens[j, pad:end].to(torch.int32), prompt_len=P - pad,
                   feats=feats[j, pad:end - 1].clone(), top_ids=top_i[j, pad:end - 1].clone(),
                   top_logp=top_p[j, pad:end - 1].clone())
        if keep_final:
            rec["final"] = final[j, pad:end - 1].clone()
        out.append(rec)
    return out


def num_chunks(items: list, batch: int, chunk_batches: int = 4) -> int:
    return -(-len(items) // (batch * chunk_batches))


def answer_prompts(model, tok, items: list[dict], layer_ids: list[int], out_dir: Path,
                   gen_tokens: int, batch: int, top_k: int, deadline: float, log,
                   chunks=None, chunk_batches: int = 4) -> bool:
    """The target answers each item's prompt greedily through its chat template; records are
    saved in chunks of chunk_batches batches under out_dir (a rerun skips saved chunks, so the
    stage resumes where a cap or a kill stopped it). chunks: which chunk indices (None: all).
    Returns False once the wall clock passed `deadline` (time.time())."""
    tok.padding_side = "left"
    stop = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    out_dir.mkdir(parents=True, exist_ok=True)
    per_chunk = batch * chunk_batches
    for i in range(num_chunks(items, batch, chunk_batches)) if chunks is None else chunks:
        path = out_dir / f"chunk-{i:04d}.pt"
        part = items[i * per_chunk:(i + 1) * per_chunk]
        if path.exists() or not part:
            continue
        if time.time() > deadline:
            return False
        t0, recs = time.time(), []
        for b in range(0, len(part), batch):
            texts = [tok.apply_chat_template([{"role": "user", "content": it["prompt"]}],
                                             tokenize=False, add_generation_prompt=True)
                     for it in part[b:b + batch]]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            res = greedy_with_features(model, enc.input_ids, enc.attention_mask, gen_tokens,
                                       layer_ids, top_k, stop)
            recs += records_from_batch(part[b:b + batch], enc.attention_mask, res, stop,
                                       keep_final=part[b].get("part") == "val")
        torch.save(recs, path)
        answer = sum(len(r["tokens"]) - r["prompt_len"] for r in recs)
        log(f"data: {out_dir.name}/{path.name} saved ({len(recs)} answers, {answer} answer "
            f"tokens, {answer / (time.time() - t0):.1f} tokens/s)")
    return True


def load_records(out_dir: Path, part: str | None = None) -> list[dict]:
    """The saved records, features flattened to [T, 3H] (the three layers side by side, in the
    order the head's fc reads them)."""
    recs = [r for f in sorted(out_dir.glob("chunk-*.pt")) for r in torch.load(f)]
    for r in recs:
        r["feats"] = r["feats"].reshape(r["feats"].shape[0], -1)
    return [r for r in recs if part is None or r["part"] == part]


def sort_by_length(items: list[dict], tok, batch: int) -> list[dict]:
    """Items ordered so that each batch holds prompts of similar length (little padding), the
    batches themselves shuffled (a cap still leaves a mix of categories)."""
    keyed = sorted(items, key=lambda it: len(tok(it["prompt"]).input_ids))
    batches = [keyed[i:i + batch] for i in range(0, len(keyed), batch)]
    random.Random(11).shuffle(batches)
    return [it for b in batches for it in b]


def code_windows(tok, files: list[Path], n: int, length: int, seed: int) -> list[list[int]]:
    """n windows of `length` tokens from the files' token stream (the toy family's prompts)."""
    import model_family as mf

    stream = mf.encode_stream(tok, mf.read_texts(files))
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(stream) - length - 1) for _ in range(n)]
    return [stream[s:s + length].astype("int64").tolist() for s in starts]


def continue_windows(model, windows: list[list[int]], part: str, layer_ids: list[int],
                     out_dir: Path, gen_tokens: int, batch: int, top_k: int, deadline: float,
                     log, chunk_batches: int = 4) -> None:
    """The toy target's greedy continuations of code windows (no stop token: an end of text is
    just a token), saved in resumable chunks like answer_prompts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    per_chunk = batch * chunk_batches
    for c in range(0, len(windows), per_chunk):
        path = out_dir / f"chunk-{c // per_chunk:04d}.pt"
        if path.exists():
            continue
        if time.time() > deadline:
            log("data: wall-clock cap reached (rerun to resume)")
            return
        recs = []
        for b in range(c, min(c + per_chunk, len(windows)), batch):
            ids = torch.tensor(windows[b:b + batch])
            mask = torch.ones_like(ids)
            res = greedy_with_features(model, ids, mask, gen_tokens, layer_ids, top_k, set())
            meta = [{"kind": "code", "part": part, "category": "stdlib"}] * ids.shape[0]
            recs += records_from_batch(meta, mask, res, set(), keep_final=part == "val")
        torch.save(recs, path)
        log(f"data: {out_dir.name}/{path.name} saved ({c + len(recs)} of {len(windows)})")
