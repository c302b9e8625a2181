"""Every retry policy of krypton, named in one place. Pure.

A policy is capped exponential backoff: the n-th consecutive failure (1-based) waits
``first * 2**(n-1)`` seconds, at most ``cap``, optionally spread by up to ``jitter`` of
itself so that many clusters failing together do not retry in step. Loops that retry until
they succeed or are cancelled run on tenacity with :meth:`Policy.wait`; loops with more
states than "failed again" (a watch that also relists, a work queue per key) ask
:meth:`Policy.delay` for the n-th delay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tenacity import wait_exponential, wait_random
from tenacity.wait import wait_base


@dataclass(frozen=True)
class Policy:
    first: float
    cap: float
    jitter: float = 0.0  # fraction of the delay added at random, 0 = none
    attempts: int = 0  # how many tries in all; 0 = until it succeeds or is cancelled

    @property
    def longest(self) -> float:
        """The longest delay this policy ever gives: the cap, jittered."""
        return self.cap * (1 + self.jitter)

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failures (1 = the first)."""
        base = min(self.first * 2 ** max(failures - 1, 0), self.cap)
        return base * (1 + random.uniform(0, self.jitter)) if self.jitter else base

    def wait(self) -> wait_base:
        """The same delays as a tenacity wait strategy."""
        strategy: wait_base = wait_exponential(multiplier=self.first, max=self.cap)
        if self.jitter:
            strategy = strategy + wait_random(0, self.first * self.jitter)
        return strategy


# engaging a cluster: probe, identity, CRD (D8); each failure is an Event on its Secret
ENGAGE = Policy(first=1.0, cap=300.0)
# restarting a cluster's worker after an unexpected error (supervision)
WORKER_RESTART = Policy(first=1.0, cap=300.0)
# reaching the watch cluster at startup
WATCH_CLUSTER = Policy(first=1.0, cap=60.0)
# a watch or list that failed (the resume keeps its resourceVersion)
WATCH = Policy(first=0.5, cap=30.0, jitter=0.2)
# a cluster over its budget (S5): its lists, watches and passes wait, 2 s doubling to 10 min
OVER_BUDGET = Policy(first=2.0, cap=600.0, jitter=0.2)
# a Tenant whose pass failed, per key in its cluster's work queue (R3)
RECONCILE = Policy(first=1.0, cap=300.0)
# a helm run that failed, per Tenant x cluster and target, kept in the Tenant's status (R18):
# 10 s, doubling, up to --retry-backoff-max, spread by up to a tenth
HELM_FIRST_RETRY = 10.0


def exhausted(failures: int, max_retries: int) -> bool:
    """More failures of one target than --max-retries: the release is stalled (R18)."""
    return failures > max_retries


def helm_failure(cap: float) -> Policy:
    return Policy(first=min(HELM_FIRST_RETRY, cap), cap=cap, jitter=0.1)


# a status write that met a conflict (409): read again and written again at once, briefly
STATUS_CONFLICT = Policy(first=0.02, cap=0.2)
# the fingerprint annotation write after a helm run: never retried by running helm again
FINGERPRINT_WRITE = Policy(first=0.2, cap=5.0, attempts=5)
