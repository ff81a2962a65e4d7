"""Tests that run in step with the pump's ticks, which Redis server time numbers."""

import time


def server_ms(client):
    """Redis server time (ms): the clock every pump numbers its ticks by."""
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def wait_for_next_tick(client, tick_ms):
    """Sleep until just after the next tick of `tick_ms` begins on the Redis clock."""
    time.sleep((tick_ms - server_ms(client) % tick_ms + 5) / 1000)


def admit_through(store, target, user_id=None):
    """Move `target`'s admitted mark as the pump would, to `user_id`'s seq (without one, past everyone in line). Seqs
    follow the server clock (lua/enter.lua), so tests name whom to admit rather than a number."""
    keys = store.keys(target)
    if user_id is None:
        mark = store.client.zrange(keys.waiting, -1, -1, withscores=True)[0][1]
    else:
        mark = store.client.zscore(keys.waiting, str(user_id))
    store.client.set(keys.mark, int(mark))
