"""What one engaged cluster may cost the operator, and its backoff as a whole when it costs
more (SPEC S5).

Its passes have a rate: PASS_RATE a second on average, PASS_BURST at once. A cluster whose
Tenants change faster than that (an admin's script editing them without end) has its passes
wait their turn; the changes of a Tenant that waits are taken together by its one pass.

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
PASS_RATE = 20.0  # passes a second one cluster may start, on average
PASS_BURST = 500  # and at once: a resync of 500 Tenants, a restart, waits for nothing


class Budget:
    """The strikes of one cluster and when its next turn comes."""

    def __init__(self, policy: retry.Policy = retry.OVER_BUDGET, *,
                 rate: float = PASS_RATE, burst: int = PASS_BURST) -> None:
        self.policy, self.rate, self.burst = policy, rate, burst
        self.strikes = 0  # since the cluster was last within its budget
        self._next = 0.0  # monotonic time its next turn comes
        self._passes = float(burst)  # passes it may start now; below 0: owed, waited for
        self._counted = time.monotonic()

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

    def take_pass(self) -> float:
        """One pass of the cluster's rate: the seconds it must wait first (0 within it)."""
        now = time.monotonic()
        self._passes = min(self.burst, self._passes + (now - self._counted) * self.rate) - 1
        self._counted = now
        return max(0.0, -self._passes / self.rate)

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
