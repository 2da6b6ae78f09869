"""Structured outputs in the verifier: grammars compiled against the served tokenizer
(compiler.py), one matcher per request walked over each step's drafts (matcher.py), drafts the
grammar forbids pruned before the step is planned (prune.py). Imports only the in-target
interface of methods/ (a drafter's ids left on the device are read back before pruning)."""
