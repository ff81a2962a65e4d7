"""A sharded line's request paths as the pump sees their effects (docs/sharding.md), until the routing of enter and
configure reaches the store: `configure` writes every sub-line's configuration, `enter` puts a user on their own
sub-line. Both call the store's own loaded scripts on the sub-line's keys; once the store routes, `store.configure`
and `store.enter` take their place."""

from __future__ import annotations

import time

from chalicelib import opening
from chalicelib.answers import Place, place_of
from chalicelib.flags import QUEUED
from chalicelib.queue_keys import QueueKeys, shard_of
from chalicelib.store import PASS_WINDOW_MS, REGISTRATION_REFRESH_MS, Defaults, QueueStore
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from chalicelib.tokens import GrantTerms


def configure(store: QueueStore, target: Target, config: TargetConfig) -> None:
    """Write `config` (its `shards` among it) to every sub-line, the sub-lines past the first before the first, with
    one opening seed, and register the target with the pump."""
    seed, commitment = opening.new_seed()
    now_ms = int(time.time() * 1000)
    settings = [item for field_value in config.to_redis().items() for item in field_value]
    for shard in reversed(range(config.shard_count)):
        k = QueueKeys(store.prefix, target, shard)
        keys, args = store._configure.order(
            config=k.config,
            events=k.events,
            stats=k.stats,
            now_ms=now_ms,
            expect="",
            fresh_seed=seed,
            fresh_commitment=commitment,
            **store.outbox,
        )
        store._configure.run(keys, (*args, *settings))
    store.client.zadd(store.global_keys.targets, {str(target): 1})


def enter(store: QueueStore, target: Target, user_id: str, now_ms: int, terms: GrantTerms, defaults: Defaults) -> Place:
    """`store.enter`, on the user's sub-line of the count sub-line 0's configuration says."""
    shards = int(store.client.hget(store.keys(target).config, "shards") or 1)
    k = QueueKeys(store.prefix, target, shard_of(user_id, shards))
    keys, args = store._enter.order(
        waiting=k.waiting,
        heartbeat=k.heartbeat,
        seq=k.seq,
        mark=k.mark,
        token=k.token(user_id),
        registered=k.registered,
        stats=k.stats,
        config=k.config,
        prequeue=k.prequeue,
        draw=k.draw,
        active=k.active,
        budget=k.budget,
        events=k.events,
        pace=k.pace,
        passed=k.passed,
        user_id=user_id,
        now_ms=now_ms,
        default_max_waiting=defaults.max_waiting,
        idle_ttl_ms=defaults.idle_ttl_ms,
        entry_key=terms.entry_key,
        grant_expires_s=terms.expires_at,
        grant_ttl_ms=terms.expires_at * 1000 - now_ms,
        grant_expires_ms=terms.expires_at * 1000,
        registration_refresh_ms=REGISTRATION_REFRESH_MS,
        default_batch=defaults.batch,
        default_tick_ms=defaults.tick_ms,
        open_on_first_use=int(defaults.open_on_first_use),
        invited=0,
        **store.outbox,
        flag_version=QUEUED.flag_version,
        queued=int(QUEUED.queued),
        pass_window_ms=PASS_WINDOW_MS,
    )
    return place_of(store._enter.read(store._enter.run(keys, args)))
