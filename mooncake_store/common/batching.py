"""The master's cap on the items of one batch call, as both the master and the client speak of
it (issue 11).

The master refuses a batch of more than `--max-batch-items` items as a whole (nothing of it
runs) with the message `too_many_message` writes; it also says its cap in `Hello`
(`max_batch_items`).  A client sends bigger batches as slices of at most the cap: it learns the
cap from Hello, falls back to `DEFAULT_MAX_BATCH_ITEMS` when an older master does not say, and
learns it from a refusal (`cap_in_message`) when the master's cap is smaller than it thought
(a master restarted with another cap).
"""

from __future__ import annotations

import re

#: The master's default --max-batch-items, and a client's guess until the master says.
DEFAULT_MAX_BATCH_ITEMS = 100_000

_CAP = re.compile(r"the master takes at most (\d+) per call \(--max-batch-items\)")


def too_many_message(method: str, count: int, cap: int) -> str:
    """Why the master refused a batch of `count` items (parsed back by `cap_in_message`)."""
    return (
        f"{method} carries {count} items; the master takes at most {cap} per call "
        "(--max-batch-items): split the batch"
    )


def cap_in_message(message: str) -> int | None:
    """The cap a batch refusal names; None when `message` is no such refusal."""
    found = _CAP.search(message)
    return int(found.group(1)) if found else None
