"""The Lua scripts (one file each in lua/): loaded once and called by SHA, alone or many in one pipeline."""

from __future__ import annotations

import hashlib
from pathlib import Path

from redis.exceptions import NoScriptError

from chalicelib.redis_connection import RedisClient

# Beside chalicelib/ in the repository, and at the package root when deployed (vendor/lua links to it).
LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
# Scripts that report a change of state: lua/outbox.lua goes before them.
_REPORTING = {"admit", "evict", "leave", "restore", "observe_purchase", "configure", "draw_finish"}


class Script:
    """One script of `client`'s, called by SHA as a raw EVALSHA. redis-py's Script adds to every call a check
    whether its client is a pipeline (an isinstance through typing's Protocol machinery) and two more wrappers."""

    def __init__(self, client: RedisClient, script: str) -> None:
        self.client = client
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()

    def __call__(self, keys: list, args: list) -> object:
        """The script's reply; a script the server has lost (restart, failover) is loaded and called again."""
        try:
            return self.client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = self.client.script_load(self.script)
            return self.client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def load_script(client: RedisClient, name: str) -> Script:
    """`lua/<name>.lua` (after `lua/outbox.lua` if it reports events), loaded on its first call and then called by SHA."""
    text = (LUA_DIR / f"{name}.lua").read_text()
    if name in _REPORTING:
        text = (LUA_DIR / "outbox.lua").read_text() + text
    return Script(client, text)


def run_pipelined(client: RedisClient, calls: list[tuple[Script, list, list]]) -> list:
    """Script calls in one non-transactional pipeline (per node in a cluster); each answer or its error.

    Scripts the server has lost (restart, failover) are loaded and only the calls they failed are sent
    again: every pump script is safe to repeat (a tick applies once, evicting and forgetting are idempotent).
    """
    replies = _send(client, calls)
    lost = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if lost:
        for script in {calls[i][0] for i in lost}:
            script.sha = client.script_load(script.script)
        for i, reply in zip(lost, _send(client, [calls[i] for i in lost])):
            replies[i] = reply
    return replies


def _send(client: RedisClient, calls: list[tuple[Script, list, list]]) -> list:
    if not calls:
        return []
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        # Raw EVALSHA: a cluster pipeline cannot load scripts (it refuses redis-py's `evalsha()`); lost scripts
        # are loaded by `run_pipelined` instead.
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    return pipe.execute(raise_on_error=False)
