"""A proposer client for engine tests: calls a proposer in this process, drafting ahead in a
worker thread as the proposer service does, without gRPC."""

from __future__ import annotations

from proposer_service.ahead import AheadRunner
from verifier_service.drafts.client import ProposerClient


class InProcessProposerClient(ProposerClient):
    """Calls a proposer in this process (anything with describe() and open_session(), i.e. a
    proposer_service.base.Proposer): for fast tests of the engine without gRPC."""

    def __init__(self, proposer):
        desc = proposer.describe()
        super().__init__(desc.method)
        self.description = desc
        self._session = proposer.open_session()
        self._ahead = AheadRunner(self._session)  # drafting ahead, as the proposer service does

    @property
    def connected(self) -> bool:
        return True

    async def propose(self, steps, timeout_s):
        await self._ahead.settle(steps)
        self._session.release(self._take_released())
        drafts = self._session.propose(steps)
        self._ahead.start()  # runs in a worker thread while the engine verifies
        return drafts

    async def flush_released(self) -> None:
        await self._ahead.settle([])
        self._session.release(self._take_released())

    def restart(self, proposer) -> None:
        """Simulate a proposer restart: its state is gone, a new epoch begins."""
        self._ahead.abandon()
        self._session.close()
        self._session = proposer.open_session()
        self._ahead = AheadRunner(self._session)
        self.epoch += 1

    async def close(self) -> None:
        await self._ahead.settle(None)
