"""Proposer services: each guesses draft tokens for the verifier's sequences, one method a pod."""
