"""OpenMP's wait policy: passive unless the user chose, set before torch loads OpenMP.

torch's CPU kernels run on an OpenMP thread pool. With OpenMP's default policy a thread that
waits for work spins for a while instead of sleeping; on a machine shared with other work those
spinning threads take cores the work needs, and two threads can run several times slower than
on an idle machine (measured: ``python benchmarks/bench_load.py --launches api,torch-first``;
see "Beside other work" in the Getting started page). OpenMP reads ``OMP_WAIT_POLICY`` once,
when torch loads it, so :func:`wait_passively` runs when ``probekit`` is imported (and again at
the command line's start): it takes effect in a process that imports probekit before torch, and
in every process probekit starts. A value the environment already holds is kept.

Example:
    >>> import os
    >>> wait_passively()
    >>> os.environ["OMP_WAIT_POLICY"] in ("PASSIVE", os.environ["OMP_WAIT_POLICY"])
    True
"""

from __future__ import annotations

import os


def wait_passively() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it already."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
