"""`vq [--api URL] COMMAND ...`: one command per thing an operator does to a sale (docs/operations.md).

Changes go through PATCH .../config, so each touches only the settings it names; `vq open` opens a target with
PUT and If-None-Match, so it never overwrites a target that is already open. Exit status: 0 done, 1 the API
refused (its code and detail are printed), 2 a usage error, 3 the API could not be reached or no credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable

from infra.vq import watch
from infra.vq.client import ApiError, OperatorApi

DEFAULT_API = "http://127.0.0.1:8000"  # make run's
_TARGET = re.compile(r"[a-z][a-z-]*/[1-9][0-9]{0,17}")
# The tick lengths (ms) --rate tries, in this order, for a whole number of users per tick: the default first.
_TICKS_FOR_A_RATE = (2000, 1000, 500, 5000, 10_000, 30_000, 60_000)


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status as the module's docstring says."""
    args = _parser().parse_args(argv)
    try:
        api = OperatorApi(args.api, region=args.region)
        return args.run(api, args) or 0
    except ApiError as err:
        print(f"vq: {err.code}: {err.detail}", file=sys.stderr)
        if err.code == "CONFIG_CHANGED" and err.headers.get("ETag"):
            print(f"vq: the version now is {err.headers['ETag']} (vq show)", file=sys.stderr)
        return 3 if err.status == 0 else 1
    except KeyboardInterrupt:
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vq",
        description="Operate the virtual waiting room: open, steer, watch and close sales. "
        "TARGET is TYPE/ID, e.g. limited-drop/42.",
    )
    parser.add_argument(
        "--api",
        default=os.environ.get("VQ_API_URL") or DEFAULT_API,
        help="the API's URL: the stack's EndpointURL output (signed with SigV4), or make run's (default: "
        f"$VQ_API_URL, else {DEFAULT_API})",
    )
    parser.add_argument(
        "--region", help="sign with SigV4 for this region (a custom domain); an execute-api URL names its own"
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def command(name: str, run: Callable, help: str, target: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(run=run)
        if target:
            sub.add_argument("target", metavar="TARGET", type=_target, help="TYPE/ID, e.g. limited-drop/42")
        return sub

    command("targets", _targets, "list the targets with users in line or in a pre-queue", target=False)
    sub = command("show", _show, "a target's settings: its own and those in force, and their version")
    sub.add_argument("--json", action="store_true", help="the API's answer as it is")

    sub = command("open", _open, "open a target for a sale (refused if it is open already: use vq set)")
    sub.add_argument("--at", metavar="ISO", help="opening time (ISO-8601 with a zone); users before it pre-queue")
    sub.add_argument("--closes", metavar="ISO", help="closing time: newcomers are refused from then on")
    sub.add_argument("--rate", help="admissions per second, e.g. 50 or 50/s or 3000/min (sets --batch and --tick-ms)")
    sub.add_argument("--batch", type=int, help="users admitted per tick")
    sub.add_argument("--tick-ms", type=int, help="tick length (ms)")
    sub.add_argument("--max-waiting", type=int, help="most users in line; more get 429 QUEUE_FULL")
    sub.add_argument("--max-active", type=int, help="most admitted users holding an unused token at once")
    sub.add_argument("--shards", type=int, help="sub-lines the line spans, for the busiest openings (docs/sharding.md)")
    sub.add_argument("--name", help="the product's name on the waiting-room page")
    sub.add_argument("--image", metavar="URL", help="the product's picture on the page (https)")
    sub.add_argument("--slo-p95-ms", type=int, help="follow the shop: cut the rate while its p95 is over this")
    sub.add_argument(
        "--slo-error-rate", type=float, help="follow the shop: cut the rate while its error share is over this"
    )
    sub.add_argument(
        "--safety-net",
        action="store_true",
        help="always on: while nobody waits, let newcomers straight through within the rate (docs/safety-net.md)",
    )
    sub.add_argument("--replace", action="store_true", help="replace the settings of a target already open")

    for name, change, text in (
        ("pause", {"paused": True}, "hold admissions; everyone keeps their place"),
        ("resume", {"paused": None}, "admit again at the rate, in the same order"),
    ):
        command(name, _patcher(change), text)
    sub = command("sold-out", _sold_out, "end the sale: users in line hear SOLD_OUT at their next poll")
    sub.add_argument("--clear", action="store_true", help="take sold out back: the line takes newcomers again")
    sub = command("close", _close, "close the line to newcomers (users in line are still admitted)")
    sub.add_argument("--at", metavar="ISO", help="when (default: now)")
    sub = command("set", _set, "change settings: key=value ... (value null removes; rate=50/s; originSlo.p95Ms=800)")
    sub.add_argument("settings", nargs="+", metavar="key=value")
    sub.add_argument("--if-match", metavar="ETAG", help="only if the settings are still this version (vq show)")

    sub = command("stats", _stats, "a target's live figures")
    sub.add_argument("--json", action="store_true", help="the API's answer as it is")
    sub = command("watch", _watch, "a live view of a target's figures (Ctrl-C ends it)")
    sub.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    sub.add_argument("--count", type=int, help="stop after this many refreshes")

    sub = command("console", _console, "open the operator console (deployed: through a local signing proxy)", False)
    sub.add_argument("--port", type=int, default=0, help="the proxy's port on 127.0.0.1 (default: a free one)")
    sub.add_argument("--no-browser", action="store_true", help="print the address; open no browser")
    sub.add_argument("--watch", metavar="TARGET", action="append", default=[], help="a target the console shows")
    return parser


def _target(text: str) -> str:
    if not _TARGET.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not TYPE/ID (e.g. limited-drop/42)")
    return text


# --- the commands ---


def _targets(api: OperatorApi, args: argparse.Namespace) -> None:
    listed = api.call("GET", "/virtual-queues").body["targets"]
    for item in sorted(listed, key=lambda t: (t["type"], int(t["id"]))):
        print(f"{item['type']}/{item['id']}")
    if not listed:
        print("no target has users in line or in a pre-queue", file=sys.stderr)


def _show(api: OperatorApi, args: argparse.Namespace) -> None:
    answer = api.call("GET", api.target_path(args.target, "config"))
    if args.json:
        print(json.dumps(answer.body, indent=2, ensure_ascii=False))
        return
    _print_config(args.target, answer)


def _open(api: OperatorApi, args: argparse.Namespace) -> None:
    settings: dict = {}
    if args.rate:
        if args.batch or args.tick_ms:
            raise SystemExit("vq open: give --rate, or --batch and --tick-ms, not both")
        settings.update(_rate(args.rate))
    for name, value in (
        ("batch", args.batch),
        ("tickMs", args.tick_ms),
        ("opensAt", args.at),
        ("closesAt", args.closes),
        ("maxWaiting", args.max_waiting),
        ("maxActive", args.max_active),
        ("shards", args.shards),
        ("displayName", args.name),
        ("imageUrl", args.image),
    ):
        if value is not None:
            settings[name] = value
    slo = {k: v for k, v in (("p95Ms", args.slo_p95_ms), ("errorRate", args.slo_error_rate)) if v is not None}
    if slo:
        settings["originSlo"] = slo
    if args.safety_net:
        settings["safetyNet"] = True
    headers = {} if args.replace else {"If-None-Match": "*"}
    try:
        answer = api.call("PUT", api.target_path(args.target, "config"), settings, headers)
    except ApiError as err:
        if err.status == 412:
            err.detail = f"{args.target} is open already: change it with vq set (or replace all with vq open --replace)"
        raise
    print(f"opened {args.target}" if not args.replace else f"replaced the settings of {args.target}")
    _print_config(args.target, answer)


def _patcher(change: dict) -> Callable[[OperatorApi, argparse.Namespace], None]:
    return lambda api, args: _patch(api, args.target, change)


def _sold_out(api: OperatorApi, args: argparse.Namespace) -> None:
    _patch(api, args.target, {"soldOut": None if args.clear else True})


def _close(api: OperatorApi, args: argparse.Namespace) -> None:
    at = args.at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _patch(api, args.target, {"closesAt": at})


def _set(api: OperatorApi, args: argparse.Namespace) -> None:
    patch: dict = {}
    for item in args.settings:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"vq set: {item!r} is not key=value")
        if name == "rate":
            patch.update(_rate(text))
            continue
        value = _value(text)
        where = patch
        *parents, leaf = name.split(".")
        for parent in parents:
            where = where.setdefault(parent, {})
        where[leaf] = value
    _patch(api, args.target, patch, {"If-Match": args.if_match} if args.if_match else None)


def _stats(api: OperatorApi, args: argparse.Namespace) -> None:
    stats = api.call("GET", api.target_path(args.target, "stats")).body
    if args.json:
        print(json.dumps(stats, indent=2, ensure_ascii=False))
        return
    print("\n".join(watch.summary(args.target, stats)))


def _watch(api: OperatorApi, args: argparse.Namespace) -> None:
    path = api.target_path(args.target, "stats")
    watch.run(lambda: api.call("GET", path).body, args.target, args.interval, args.count)


def _console(api: OperatorApi, args: argparse.Namespace) -> None:
    from infra.vq.console_proxy import serve_console

    serve_console(api, args.port, open_browser=not args.no_browser, watched=args.watch)


# --- helpers ---


def _patch(api: OperatorApi, target: str, patch: dict, headers: dict | None = None) -> None:
    sent = {"Content-Type": "application/merge-patch+json", **(headers or {})}
    answer = api.call("PATCH", api.target_path(target, "config"), patch, sent)
    print(f"changed {target}: {json.dumps(patch, ensure_ascii=False)}")
    _print_config(target, answer)


def _print_config(target: str, answer) -> None:
    own, effective = answer.body["config"], answer.body["effective"]
    rate = effective["batch"] * 1000 / effective["tickMs"]
    print(f"{target}  version {answer.headers.get('ETag', '?')}")
    print(f"  {'admissions':<12} {_number(rate)}/s ({effective['batch']} every {effective['tickMs']} ms)")
    for name, value in effective.items():
        if name in ("batch", "tickMs"):
            continue
        mark = "" if name in own or name in ("paused", "soldOut") else "  (default)"
        print(f"  {name:<12} {json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else value}{mark}")


def _rate(text: str) -> dict:
    """batch and tickMs for `text` admissions per second ("50", "50/s", "3000/min"): the first tick length of
    _TICKS_FOR_A_RATE that takes a whole number of users."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*(s|sec|second|min|minute))?\s*", text)
    if not match:
        raise SystemExit(f"vq: rate {text!r} is not a number of admissions per second, e.g. 50/s or 3000/min")
    per_second = float(match[1]) / (60 if (match[2] or "s").startswith("min") else 1)
    for tick_ms in _TICKS_FOR_A_RATE:
        batch = per_second * tick_ms / 1000
        if batch >= 1 and abs(batch - round(batch)) < 1e-9:
            return {"batch": round(batch), "tickMs": tick_ms}
    raise SystemExit(f"vq: no tick of {_TICKS_FOR_A_RATE} ms admits {text} in whole users: give --batch and --tick-ms")


def _value(text: str) -> object:
    """A setting's value: JSON where it parses (numbers, true, false, null, objects), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}".rstrip("0")


if __name__ == "__main__":
    sys.exit(main())
