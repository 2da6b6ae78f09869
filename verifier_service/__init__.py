"""The verifier service: target model, KV cache, scheduler, and the rejection sampler."""
