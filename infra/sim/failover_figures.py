"""What a failover cost a sale, from what its users were told and what reached the shop (infra/sim/failover.py runs
the sale; docs/failover.md says what each figure counts). Reads a simulate.Sale and the failover's record; imports
nothing that sets the app's environment, so tests can call it in their own process."""

from __future__ import annotations

import math
from collections import Counter

from chalicelib.tokens import TokenSigner

SETTLE_S = 5.0  # the window of admissions ends this long after the pump's first tick on the promoted node


def figures(sale, failover, lag_s: float) -> dict:
    """What the failover cost the sale; docs/failover.md says what each figure counts."""
    users, shop, settings, started = sale.users, sale.shop, sale.settings, sale.started
    killed = failover.killed_at
    signer = TokenSigner(settings.keyring)
    token_id = {text: signer.read_entry_token(text, at).token_id for u in users for at, _, text in u.tokens}
    rate_per_s = settings.batch_size * 1000 / settings.tick_ms

    seq_tickets = Counter(seq for u in users for _, seq in u.tickets)
    # Per user: how many token ids they were handed, and whether one was a direct admission (fail-open).
    token_ids = [
        (len({token_id[text] for _, _, text in u.tokens}), any(s == "DIRECT_ADMITTED" for _, s, _ in u.tokens))
        for u in users
    ]
    keys_at_shop: dict[int, set] = {}
    for request in shop["requests"]:
        keys_at_shop.setdefault(request["userId"], set()).add(request["key"])
    requests_per_key = Counter(request["key"] for request in shop["requests"])
    direct_ids: dict[str, bool] = {}  # token id -> whether it was ever handed out directly (fail-open)
    for u in users:
        for _, status, text in u.tokens:
            direct_ids[token_id[text]] = direct_ids.get(token_id[text], False) or status == "DIRECT_ADMITTED"
    orders_per_user = Counter(order["userId"] for order in shop["orders"])

    # Tokens by when each id was first handed, and whether its user held a ticket then.
    handed: dict[str, tuple[float, str, bool]] = {}
    for u in users:
        for at, status, text in u.tokens:
            had_ticket = bool(u.tickets) and u.tickets[0][0] < at
            handed.setdefault(token_id[text], (at, status, had_ticket))
    first_tick_after = min((at for at, _ in sale.pump.ticks if at > failover.promoted_at), default=math.inf)
    window = (killed, first_tick_after + SETTLE_S)
    in_window = [h for h in handed.values() if window[0] <= h[0] < window[1]]
    window_s = window[1] - window[0]
    per_second = Counter(int(at - started) for at, _, _ in handed.values())

    def first_token_at(u) -> float:
        return min((at for at, _, _ in u.tokens), default=math.inf)

    waiting_at_kill = [u for u in users if u.tickets and u.tickets[0][0] < killed < first_token_at(u)]
    let_in_directly = [
        u for u in waiting_at_kill if any(status == "DIRECT_ADMITTED" and at < window[1] for at, status, _ in u.tokens)
    ]
    direct = sorted(at for at, status, _ in handed.values() if status == "DIRECT_ADMITTED")
    behind_s = lag_s if math.isnan(failover.lag_seen_s) else failover.lag_seen_s
    return {
        "lag_s": lag_s,
        "replica_behind_at_kill_s": round(failover.lag_seen_s, 3),
        "stream_lost_bytes": failover.stream_lost_bytes,
        "killed_at_s": round(killed - started, 2),
        "promoted_at_s": round(failover.promoted_at - started, 2),
        "users": len(users),
        "bought": sum(u.outcome == "bought" for u in users),
        # Places the replica cannot have had: acknowledged within its lag before the kill.
        "places_in_lost_writes": sum(1 for u in users for at, _ in u.tickets if killed - behind_s <= at < killed),
        "places_lost": sum(u.reentries > 0 or u.came_back == "NOT_IN_QUEUE" for u in users),
        "seqs_on_two_tickets": sum(n > 1 for n in seq_tickets.values()),
        "two_token_ids_after_fail_open": sum(ids > 1 and direct for ids, direct in token_ids),
        "two_token_ids_queued_twice": sum(ids > 1 and not direct for ids, direct in token_ids),
        "users_at_shop_under_two_keys": sum(len(keys) > 1 for keys in keys_at_shop.values()),
        "second_orders": sum(n - 1 for n in orders_per_user.values()),
        # A key the shop got twice: the token bought, and the gate let it buy again.
        "consume_markers_lost": sum(n > 1 and not direct_ids[k] for k, n in requests_per_key.items()),
        "outage_uses_not_written_back": sum(n > 1 and direct_ids[k] for k, n in requests_per_key.items()),
        "resent_purchases": dict(Counter(u.resent for u in users if u.resent is not None)),
        "window_s": round(window_s, 2),
        "allowed_in_window": math.floor(rate_per_s * window_s) + settings.batch_size,
        "let_in_queued": sum(status == "ADMITTED" for _, status, _ in in_window),
        "let_in_directly_ticket_holders": sum(status == "DIRECT_ADMITTED" and had for _, status, had in in_window),
        "let_in_directly_newcomers": sum(status == "DIRECT_ADMITTED" and not had for _, status, had in in_window),
        "waiting_at_kill": len(waiting_at_kill),
        "waiting_at_kill_let_in_directly": len(let_in_directly),
        "fail_open_s": round(direct[-1] - direct[0], 2) if direct else 0.0,
        "peak_tokens_in_a_second": max(per_second.values(), default=0),
        "rate_per_s": rate_per_s,
    }


# The table: a label, and the figure of one run it shows (a name, or a function of the run's figures).
ROWS = [
    ("replica behind at the kill (s, measured)", "replica_behind_at_kill_s"),
    ("replication stream lost (bytes, at least)", "stream_lost_bytes"),
    ("places acknowledged within that lag", "places_in_lost_writes"),
    ("places lost (told NOT_IN_QUEUE)", "places_lost"),
    ("seqs on two tickets", "seqs_on_two_tickets"),
    ("users handed two token ids: after fail-open", "two_token_ids_after_fail_open"),
    ("  queued, admitted again", "two_token_ids_queued_twice"),
    ("users at the shop under two keys", "users_at_shop_under_two_keys"),
    ("  second orders (the demo shop: one per user)", "second_orders"),
    ("consume markers lost (a key bought twice)", "consume_markers_lost"),
    ("  outage uses not written back (bought twice)", "outage_uses_not_written_back"),
    ("window from the kill (s)", "window_s"),
    ("  allowed in it (rate x window + batch)", "allowed_in_window"),
    (
        "  let in, all",
        lambda f: f["let_in_queued"] + f["let_in_directly_ticket_holders"] + f["let_in_directly_newcomers"],
    ),
    ("  let in: queued", "let_in_queued"),
    ("  let in: directly, ticket holders", "let_in_directly_ticket_holders"),
    ("  let in: directly, newcomers", "let_in_directly_newcomers"),
    ("waiting at the kill", "waiting_at_kill"),
    ("  of them let in directly (%)", lambda f: _share(f["waiting_at_kill_let_in_directly"], f["waiting_at_kill"])),
    ("fail-open lasted (s)", "fail_open_s"),
    ("peak tokens in a second (rate/s)", lambda f: f"{f['peak_tokens_in_a_second']} ({f['rate_per_s']:g})"),
]


def _share(part: int, whole: int) -> int | None:
    return round(100 * part / whole) if whole else None


def table(runs: dict[float, list[dict]]) -> list[tuple[str, list[str]]]:
    """One row per figure, one cell per lag: every run's value, in run order."""

    def cell(figure, run: dict) -> str:
        return str(run[figure] if isinstance(figure, str) else figure(run))

    return [
        (label, [" / ".join(cell(figure, f) for f in figures) for figures in runs.values()]) for label, figure in ROWS
    ]
