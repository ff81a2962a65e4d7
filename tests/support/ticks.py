"""Tests that run in step with the pump's ticks, which Redis server time numbers."""

import time


def server_ms(client):
    """Redis server time (ms): the clock every pump numbers its ticks by."""
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def wait_for_next_tick(client, tick_ms):
    """Sleep until just after the next tick of `tick_ms` begins on the Redis clock."""
    time.sleep((tick_ms - server_ms(client) % tick_ms + 5) / 1000)
