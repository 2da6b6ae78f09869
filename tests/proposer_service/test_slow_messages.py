"""Slow step messages and missed deadlines are said in the log, the first few and then every
hundredth: a stalled proposer shows where its time went without flooding the log."""

import logging

from proposer_service.servicer import SlowMessages
from verifier_service.drafts.client import GrpcProposerClient


def test_a_slow_message_is_logged_with_where_its_time_went(caplog):
    slow = SlowMessages("draft")
    with caplog.at_level(logging.WARNING, logger="proposer_service.servicer"):
        slow.check(1, 0.001, 0.01)  # fast: nothing
        slow.check(2, 0.2, 0.3)
    assert slow.count == 1
    [record] = caplog.records
    assert "2 sequence(s) took 500 ms" in record.getMessage()
    assert "drafting ahead 200 ms, proposing 300 ms" in record.getMessage()


def test_slow_messages_are_logged_first_three_then_every_hundredth(caplog):
    slow = SlowMessages("draft")
    with caplog.at_level(logging.WARNING, logger="proposer_service.servicer"):
        for _ in range(250):
            slow.check(1, 0.0, 1.0)
    assert slow.count == 250
    assert len(caplog.records) == 3 + 2  # 1, 2, 3, 100, 200


def test_a_missed_deadline_is_counted_and_logged_rate_limited(caplog):
    client = GrpcProposerClient("draft", "127.0.0.1:1", vocab_size=10, fingerprint="x")
    with caplog.at_level(logging.WARNING, logger="verifier_service.drafts.client"):
        for _ in range(120):
            client._missed(2.0, 3)
    assert client.missed_deadlines == 120
    assert len(caplog.records) == 4  # 1, 2, 3, 100
    assert "3 sequence(s) within the 2000 ms deadline" in caplog.records[0].getMessage()
