"""The wait-time histogram kept per target: geometric buckets, so any wait is known within 10%.

Bucket 0 holds waits under one second; bucket i >= 1 holds [GROWTH**(i-1), GROWTH**i) seconds; the last
bucket also holds everything longer (about 25 hours and up).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

GROWTH = 1.1
LAST_BUCKET = 100


def bucket_of(wait_s: float) -> int:
    if wait_s < 1:
        return 0
    return min(LAST_BUCKET, int(math.log(wait_s) / math.log(GROWTH)) + 1)


def bounds(bucket: int) -> tuple[float, float]:
    """The waits (seconds) a bucket holds: [low, high)."""
    if bucket == 0:
        return 0.0, 1.0
    return GROWTH ** (bucket - 1), GROWTH**bucket


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The upper edge of the bucket holding the q-quantile (0 < q <= 1) of the waits counted, or None."""
    total = sum(counts.values())
    if total == 0:
        return None
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= q * total:
            return bounds(bucket)[1]
    return bounds(max(counts))[1]  # only float rounding of q * total gets here
