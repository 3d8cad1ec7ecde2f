"""The event loop the daemons and the sync client run on: uvloop where it is installed.

On these VMs a loopback round trip between two asyncio processes costs ~145 us on the stock
selector loop and ~80 us on uvloop (a blocking socket pair: ~80 us), and a control call is a
round trip, so the loop matters.  MOONCAKE_EVENT_LOOP=asyncio forces the stock loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    if os.environ.get("MOONCAKE_EVENT_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    return loop_factory()()
