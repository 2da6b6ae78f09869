"""The target model as this process holds it: loaded onto its device with its KV cache
(target.py) and run over a packed, ragged batch on the paged cache (runner.py).

May import config, kv/, step/ (the plan it runs) and methods.eagle.checkpoint (the tables an
EAGLE head reads); imported by tp/ and the top.
"""
