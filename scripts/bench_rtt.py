"""Issue 19's Service Bus drain again, with a network round trip between client and broker.

The test broker answers on loopback in well under a millisecond, so the SDK's raw
receive+complete loop (which starts no process) is bound only by Python's CPU, while a
worker starts a process per task: on loopback the comparison measures process spawning, not
dispatch.  Here both sides talk to the same broker through the project's TCP fault proxy
(``tests/faults/proxy.py``) holding every chunk ``ONE_WAY`` seconds in each direction: a
round trip of about 10 ms, an assumption standing for a namespace in the client's region
(no Service Bus namespace is reachable from here to measure one).  The proxy delays chunk by
chunk on one thread per direction, so frames queued behind one another wait in turn: a
rough model of a network, the same for both sides.

Everything runs on the bench's main thread, except the proxy's and the reference loop's
threads.
"""

from __future__ import annotations

import sys

from bench_dispatch import broker, servicebus_drains
from benchlib import REPO, Bench

ONE_WAY = 0.005  # s each chunk is held, each direction


def _through_proxy(conn: str, port: int) -> str:
    """``conn`` with its endpoint's port replaced by the proxy's."""
    endpoint, _, rest = conn.partition(";")
    return f"{endpoint.rsplit(':', 1)[0]}:{port};{rest}"


def fig_drain_servicebus_rtt(b: Bench) -> None:
    """Acceptance 2 of issue 19 with a ~10 ms round trip: -n 4 and -n 16 next to the raw
    loop, both through the same delaying proxy."""
    sys.path.insert(0, str(REPO))
    from tests.faults.proxy import FaultProxy

    with broker(b.tmp) as direct:
        port = int(direct.split(";", 1)[0].rsplit(":", 1)[1])
        with FaultProxy(("127.0.0.1", port)) as proxy:
            proxy.latency(ONE_WAY)
            servicebus_drains(b, _through_proxy(direct, proxy.port), "rt",
                              "drain_servicebus_rtt",
                              "Service Bus drain, ~10 ms round trip, {n} true, -n {slots}",
                              "raw 1-msg receive+complete, 4 threads, same proxy: {raw:.0f}/s")
