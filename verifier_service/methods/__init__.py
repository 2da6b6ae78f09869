"""Methods whose drafts come from inside the verifier (registry kind `in_target`): the
interface every such method implements and the step reads (in_target.py), lookahead decoding
(lookahead.py), EAGLE heads on the target's features (eagle/) and the tokens a structured
request's grammar forces (grammar.py: handed the request's grammar state; offered to
structured requests only).

May import batching/ (the scheduled sequences they draft for); nothing of the step, the
engine or the wire. Imported by step/ and drafts/ through in_target.py's public names only, by
model/ for the EAGLE checkpoint's tables, and by the engine; splitspec/methods.py names each
method's class for the registry.
"""
