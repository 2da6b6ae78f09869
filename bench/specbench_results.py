"""bench/specbench.py's results file: what each finished unit of a run measured (Hugging Face's
baseline; each configuration, with its repeated-question pass, its seeded answers and its step
cost), written when the unit finishes, so that a stopped run keeps what it finished and
`--resume` continues it.

    {"format": 1,
     "settings": {...},              what every unit must share: the questions, the answer
                                     lengths, the seeded check, the model, the threads, ...
     "sessions": [{"started", "commit", "facts"}],   each run that wrote to it
     "units": {"hf" | config key: {"label", "definition", "session", "commit", "finished",
                                   "wall_s", "rows": {row label: [answer]}, "repeat_label",
                                   "seeded": {question id: [[ids] per turn]},
                                   "cost": StepSplit | null, "timing": {pass: seconds}}}}

A unit is reused by --resume when the file's settings equal this run's and its definition (the
request and the stack a configuration asks) equals this one's; anything else is refused, with
what differs, before a stack starts. The file is replaced whole (written beside, then renamed),
so a run killed while writing leaves the previous version. The report is rendered from the file
alone, for a fresh run as for a resumed one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specbench_cost import StepSplit
from specbench_speed import Answer, Turn

FORMAT = 1
HF_KEY = "hf"


class ResumeRefused(Exception):
    """--resume asked of a file whose results were taken under other settings."""


def settings_of(args, questions) -> dict:
    """What every unit of one results file must share: a unit measured under other values is
    another experiment. The commit is not here: each unit records its own."""
    text = json.dumps([[q.question_id, list(q.turns)] for q in questions])
    return {
        "model": Path(args.model).name,
        "questions": [q.question_id for q in questions],
        "questions_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
        "max_new_tokens": args.max_new_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
        "seeded": list(args.seeded or []),
        "seed": args.seed if args.seeded else None,
        "seeded_max_new_tokens": args.seeded_max_new_tokens if args.seeded else None,
        "threads": args.threads,
        "proposer_threads": args.proposer_threads,
        "max_k": args.max_k,
        "shared_stack": args.shared_stack,
    }


def differences(old: dict, new: dict) -> list[str]:
    """Each setting whose value differs, as 'name: file X, this run Y'."""
    return [f"{k}: the file's {old.get(k)!r}, this run's {new.get(k)!r}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def definition_of(cfg) -> dict:
    """A configuration as its unit records it: the request and the stack it asks."""
    return {"speculation": cfg.speculation, "methods": list(cfg.methods),
            "proposer_args": [[m, list(a)] for m, a in cfg.proposer_args]}


HF_DEFINITION = {"generate": "Hugging Face transformers, plain greedy"}


# -- (de)serialising what a unit measured ------------------------------------------------------

def answers_to_json(answers: list[Answer]) -> list[dict]:
    return [asdict(a) for a in answers]


def answers_from_json(items: list[dict]) -> list[Answer]:
    def turn(t: dict) -> Turn:
        return Turn(**{**t, "ids": tuple(t["ids"]), "step_drafts": tuple(t["step_drafts"]),
                       "step_accepted": tuple(t["step_accepted"])})

    return [Answer(a["question_id"], a["group"], [turn(t) for t in a["turns"]]) for a in items]


def cost_from_json(item: dict | None) -> StepSplit | None:
    if item is None:
        return None
    return StepSplit(**{**item, "kinds": {k: tuple(v) for k, v in item["kinds"].items()}})


@dataclass
class Unit:
    """What one unit measured, as the harness hands it over (rows: its main row first)."""

    label: str
    definition: dict
    rows: dict[str, list[Answer]]
    wall_s: float
    timing: dict[str, float] = field(default_factory=dict)
    repeat_label: str | None = None
    seeded: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    cost: StepSplit | None = None

    def to_json(self) -> dict:
        return {"label": self.label, "definition": self.definition,
                "rows": {k: answers_to_json(v) for k, v in self.rows.items()},
                "repeat_label": self.repeat_label,
                "seeded": {str(q): [list(t) for t in turns] for q, turns in self.seeded.items()},
                "cost": None if self.cost is None else asdict(self.cost),
                "timing": self.timing, "wall_s": self.wall_s}

    @classmethod
    def from_json(cls, item: dict) -> Unit:
        return cls(item["label"], item["definition"],
                   {k: answers_from_json(v) for k, v in item["rows"].items()},
                   item["wall_s"], dict(item["timing"]), item.get("repeat_label"),
                   {int(q): [tuple(t) for t in turns] for q, turns in item["seeded"].items()},
                   cost_from_json(item.get("cost")))


# -- the file ----------------------------------------------------------------------------------

class Results:
    """A run's results file: opened fresh or resumed, one unit recorded at a time."""

    def __init__(self, path: Path, data: dict, session: int):
        self.path, self.data, self.session = Path(path), data, session

    @classmethod
    def open(cls, path: str | Path, settings: dict, facts: dict[str, str],
             resume: bool) -> Results:
        """A fresh file (replacing any there when the first unit finishes), or with `resume`
        the one there, whose settings must be this run's (ResumeRefused says what differs)."""
        path = Path(path)
        data = {"format": FORMAT, "settings": settings, "sessions": [], "units": {}}
        if resume and path.exists():
            old = json.loads(path.read_text())
            if old.get("format") != FORMAT:
                raise ResumeRefused(f"{path}: results format {old.get('format')!r}, this "
                                    f"harness writes {FORMAT}")
            if (diff := differences(old["settings"], settings)):
                raise ResumeRefused(
                    f"cannot resume {path}: its results were taken under other settings ("
                    + "; ".join(diff) + "). Run with the file's settings, or without --resume "
                    "to start afresh (the file is then replaced), or give another --results.")
            data = old
        data["sessions"].append({"started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                 "commit": facts.get("commit", "unknown"), "facts": facts})
        return cls(path, data, len(data["sessions"]) - 1)

    @property
    def units(self) -> dict[str, dict]:
        return self.data["units"]

    def holds(self, key: str, definition: dict, repeat_label: str | None = None) -> bool:
        """Whether the unit `key` is done as this run asks it: recorded, with the same
        definition (another is refused: ResumeRefused), and with its repeated pass when this
        run asks one of it."""
        unit = self.units.get(key)
        if unit is None:
            return False
        if unit["definition"] != definition:
            raise ResumeRefused(
                f"cannot resume {self.path}: its configuration {key!r} was "
                f"{unit['definition']}, this run's is {definition}. Give this one another "
                "key (--config), or start afresh without --resume.")
        return repeat_label is None or unit.get("repeat_label") == repeat_label

    def record(self, key: str, unit: Unit) -> None:
        """The unit, written at once (the whole file, replaced atomically)."""
        item = unit.to_json()
        session = self.data["sessions"][self.session]
        item.update(session=self.session, commit=session["commit"],
                    finished=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
        self.units.pop(key, None)  # a unit run again goes last, as it ran
        self.units[key] = item
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)

    def unit(self, key: str) -> Unit:
        return Unit.from_json(self.units[key])


def gather(results: Results, keys: list[str], repeat_key: str | None) -> dict:
    """The report's inputs from the units `keys` (in that order) that the file holds: {"answers":
    {row label: [Answer]}, "seeded": {label: {qid: [ids per turn]}}, "cost": {label:
    StepSplit}, "timing": {pass: seconds}, "repeat_label": str | None, "wall_s": the units'
    wall time summed, "pending": the keys it lacks, "sessions": [{"started", "commit", "facts",
    "rows": [label]}] of the sessions that measured them, oldest first}. A repeated pass is
    reported only as the unit `repeat_key`'s."""
    out = {"answers": {}, "seeded": {}, "cost": {}, "timing": {}, "repeat_label": None,
           "wall_s": 0.0, "pending": [k for k in keys if k not in results.units]}
    rows_of: dict[int, list[str]] = {}
    for key in keys:
        if key not in results.units:
            continue
        item, unit = results.units[key], results.unit(key)
        for label, answers in unit.rows.items():
            if label == unit.repeat_label:
                if key != repeat_key:
                    continue
                out["repeat_label"] = label
            out["answers"][label] = answers
        if unit.seeded:
            out["seeded"][unit.label] = unit.seeded
        if unit.cost is not None:
            out["cost"][unit.label] = unit.cost
        out["timing"].update({k: v for k, v in unit.timing.items()
                              if k != unit.repeat_label or key == repeat_key})
        out["wall_s"] += unit.wall_s
        rows_of.setdefault(item["session"], []).append(unit.label)
    out["sessions"] = [{**results.data["sessions"][s], "rows": rows}
                       for s, rows in sorted(rows_of.items())]
    return out
