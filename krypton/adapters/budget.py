"""What one engaged cluster may cost the operator, and its backoff as a whole when it costs
more (SPEC S5).

An answer past a bound (too large, too many objects, a list that never completes, an object
without the fields krypton reads) is a strike of its cluster. After a strike, the cluster's
lists, watches and passes all wait until its turn comes again, on a growing schedule that a
quick recovery does not reset: the cluster is back within its budget only once it has had its
turn and gone `QUIET` seconds since without a strike. So a server that repeats the
same answer is asked less and less often, and is reported once, not as failing and recovered
in turn.
"""

from __future__ import annotations

import asyncio
import time

from krypton.decisions import retry

QUIET = 60.0  # seconds without a strike before a cluster counts as within its budget again


class Budget:
    """The strikes of one cluster and when its next turn comes."""

    def __init__(self, policy: retry.Policy = retry.OVER_BUDGET) -> None:
        self.policy = policy
        self.strikes = 0  # since the cluster was last within its budget
        self._next = 0.0  # monotonic time its next turn comes

    @property
    def over(self) -> bool:
        return self.strikes > 0

    def strike(self) -> float:
        """An answer past a bound: the cluster waits longer than after the last strike.
        Returns the wait."""
        self.strikes += 1
        now = time.monotonic()
        wait = self.policy.delay(self.strikes)
        self._next = max(self._next, now + wait)
        return wait

    async def turn(self) -> None:
        """Wait until the cluster's next turn (at once when within its budget)."""
        while (left := self._next - time.monotonic()) > 0:
            await asyncio.sleep(left)

    def settled(self) -> bool:
        """True once, when a cluster over its budget has had its turn and gone QUIET seconds
        since without a strike: it is within its budget again."""
        if not self.strikes or time.monotonic() - self._next < QUIET:
            return False
        self.strikes = 0
        return True
