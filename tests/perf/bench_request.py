"""Benchmark: handler CPU per API request, by component, against a minimal Chalice route making the same script call.

Run: .venv/bin/python tests/perf/bench_request.py   (a Valkey of its own, or BENCH_REDIS_URL)
Measures, in one process, in at least 7 rounds (each with its load average) of 20 slices in which the measures
take turns:
  - the Lambda handler `app(event, context)` on an API Gateway (REST, proxy) event, logging and metrics on as
    deployed (written to a file, as Lambda writes stdout): a waiting user's status poll, and a newcomer's enter;
  - the framework's floor: the same event through a minimal Chalice app (Chalice's defaults) whose one route makes
    the same script call (recorded from the real request, replayed through the same redis-py client) and answers
    its reply as a dict, which Chalice serializes;
  - the handler with redis-py's pure-Python packing and parsing in place of hiredis's, when hiredis is installed
    (BENCH_PURE_PYTHON_REDIS=1 makes every measure go without hiredis);
  - the status poll by identity mode (chalicelib/identity.py), in the same slices: header (X-User-Id), jwt (an
    RS256 JWT of about 1 KB, as Auth0 or Cognito issue them, with the per-container cache of verified tokens, as
    deployed), and jwt verifying the JWT on every poll (no cache), which is what the cache is measured against.
The switch reads its flag as deployed: from an AppConfig session (its client answering infra/flags.json), not from
the local file, which it would stat on every request.
Totals are this process's CPU time per request (a loaded machine still inflates it: hence the slices).
Components are measured inside real handler calls in an instrumented slice of each turn (the timers are in
place only there, so the totals time the code as deployed): routing and middleware, the flag, tickets and
tokens, logging and metrics, JSON, redis-py (packing, sending, parsing: CPU), and the Redis wait (wall time
inside redis-py less its CPU). Spans are CPU time less the timer's own cost (calibrated); routing, middleware
and the rest of the handler are the total CPU less the named components.
Prints a table and writes build/bench_request.json. Targets: handler CPU per status request at most 1.5x the floor's,
and in jwt mode at most 1.2x header mode's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
import types
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator

import benchlib  # beside this file

sys.path.insert(0, str(benchlib.ROOT))

TARGET_RATIO = 1.5
JWT_TARGET_RATIO = 1.2  # a status poll's handler CPU in jwt mode against header mode
IDENTITY_MODES = ("header", "jwt", "jwt, no cache")
JWT_USER = "auth0|65f1c0d2e4b0a1b2c3d4e5f6"
SENTINEL = 900_000_000_001  # the new user whose enter is recorded, replaced by a fresh one per floor call
SLICES, PER_SLICE = benchlib.scaled(20, 2), benchlib.scaled(50, 5)  # per round, per measure
AHEAD = 150  # users in line ahead of the polling one: more than a tick admits (batch 100), so its poll cannot admit
COMPONENTS = ("flag", "ticket and token", "logging and metrics", "JSON", "redis-py (CPU)")


def api_event(method: str, resource: str, params: dict[str, str], headers: dict[str, str]) -> dict:
    """An API Gateway REST proxy event, as Lambda hands it to the function."""
    path = resource.format(**params)
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": params,
        "stageVariables": None,
        "body": None,
        "isBase64Encoded": False,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": method,
            "path": f"/api{path}",
            "stage": "api",
            "requestId": str(uuid.uuid4()),
            "accountId": "123456789012",
            "apiId": "a1b2c3d4e5",
            "identity": {"sourceIp": "203.0.113.7", "userAgent": "Mozilla/5.0"},
            "protocol": "HTTP/1.1",
            "requestTimeEpoch": int(time.time() * 1000),
        },
    }


def headers(user: int | str, ticket: str | None = None) -> dict[str, str]:
    found = {
        "Accept": "application/json",
        "Host": "api.example.com",
        "User-Agent": "Mozilla/5.0",
        "X-Amzn-Trace-Id": "Root=1-00000000-000000000000000000000000",
        "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Port": "443",
        "X-Forwarded-Proto": "https",
        "X-User-Id": str(user),
    }
    if ticket:
        found["X-Queue-Ticket"] = ticket
    return found


class Spans:
    """CPU time spent in chosen functions, by component; the outermost timed call counts.

    The timed wrappers are in place only inside `installed()`: the totals are measured on the code as deployed
    (in place, the wrappers would add their own calls, 2 to 5 us a status request, to the handler's total)."""

    def __init__(self) -> None:
        self.busy = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.wait = 0.0
        self._patches: list[tuple[object, str, object, object]] = []  # owner, name, own attribute or None, timed

    def wrap(self, owner: object, name: str, component: str) -> None:
        """Time `owner.name` (a function, method or staticmethod) as `component`, if it exists."""
        original = getattr(owner, name, None)
        if original is None:
            return
        own = vars(owner).get(name)
        process_time = time.process_time

        def timed(*args, **kwargs):
            if self.busy:
                return original(*args, **kwargs)
            self.busy = True
            started = process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[component] += process_time() - started
                self.calls[component] += 1
                self.busy = False

        self._patches.append((owner, name, own, staticmethod(timed) if isinstance(own, staticmethod) else timed))

    def wrap_redis(self, owner: object, name: str) -> None:
        """Time a redis-py call: its CPU is redis-py's work, the rest of its wall time the Redis wait."""
        original = getattr(owner, name)
        perf_counter, process_time = time.perf_counter, time.process_time

        def timed(*args, **kwargs):
            started, cpu = perf_counter(), process_time()
            try:
                return original(*args, **kwargs)
            finally:
                cpu = process_time() - cpu
                self.seconds["redis-py (CPU)"] += cpu
                self.wait += perf_counter() - started - cpu
                self.calls["redis-py (CPU)"] += 1

        self._patches.append((owner, name, vars(owner).get(name), timed))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The timed wrappers in place of the functions they time, for the time of the block."""
        for owner, name, _, timed in self._patches:
            setattr(owner, name, timed)
        try:
            yield
        finally:
            for owner, name, own, _ in self._patches:
                if own is None:  # inherited, or the class's method on an instance
                    delattr(owner, name)
                else:
                    setattr(owner, name, own)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.wait = 0.0


def instrument(spans: Spans, client) -> None:
    """Wrap the functions of each component, where this version of the code has them; `client` is the store's."""
    import chalice.app

    import app as app_module
    from chalicelib import flags, queue, tokens
    from chalicelib.observability import logger

    for name in ("queue_enabled", "decide", "adopt"):
        spans.wrap(flags.QueueSwitch, name, "flag")
    signing = ("read_ticket", "issue_ticket", "grant", "grant_terms", "seal_entry_token", "mint_entry_token")
    for name in (*signing, "read_entry_token"):
        spans.wrap(tokens.TokenSigner, name, "ticket and token")
    for module in (app_module, queue):
        for name in ("open_request_keys", "close_request_keys", "add_request_keys", "count"):
            if name in vars(module):
                spans.wrap(module, name, "logging and metrics")
    for name in ("clear_state", "set_correlation_id", "append_keys", "info", "warning"):
        spans.wrap(logger, name, "logging and metrics")
    # Chalice serializes a dict answer with its module's `json.dumps` (the floor's answers): a stand-in module whose
    # dumps is timed. The app serializes its own answers.
    chalice.app.json = types.SimpleNamespace(loads=json.loads, dumps=json.dumps)
    spans.wrap(chalice.app.json, "dumps", "JSON")
    spans.wrap(app_module, "_json_text", "JSON")
    # The client's command (packing, sending, parsing, and the client's own connection handling), whatever calls it:
    # what the floor's route calls too.
    spans.wrap_redis(type(client), "execute_command")


def calibrate() -> dict[str, float]:
    """Seconds a span books for a call that does nothing, by component: the timers' own share, taken off every span."""
    dummy = types.SimpleNamespace(nothing=lambda: None, redis=lambda: None)
    calibration = Spans()
    calibration.wrap(dummy, "nothing", "calibration")
    calibration.wrap_redis(dummy, "redis")
    with calibration.installed():
        for _ in range(20_000):
            dummy.nothing()
            dummy.redis()
    overhead = dict.fromkeys(COMPONENTS, calibration.seconds["calibration"] / calibration.calls["calibration"])
    overhead["redis-py (CPU)"] = calibration.seconds["redis-py (CPU)"] / calibration.calls["redis-py (CPU)"]
    return overhead


@contextlib.contextmanager
def pure_python_redis(client) -> Iterator[None]:
    """redis-py's own packing and parsing instead of hiredis's, on connections made afresh (the pool's, and the
    calling thread's own: chalicelib/redis_connection.py)."""
    import redis.connection

    pool = client.connection_pool
    default, hiredis = pool.connection_kwargs.get("parser_class"), redis.connection.HIREDIS_AVAILABLE
    fresh_connections(client)
    redis.connection.HIREDIS_AVAILABLE = False  # read when a connection is made: picks the command packer
    pool.connection_kwargs["parser_class"] = redis.connection._RESP2Parser  # RESP3's when the protocol says so
    try:
        yield
    finally:
        redis.connection.HIREDIS_AVAILABLE = hiredis
        if default is None:
            del pool.connection_kwargs["parser_class"]
        else:
            pool.connection_kwargs["parser_class"] = default
        fresh_connections(client)


def fresh_connections(client) -> None:
    """Every connection `client` holds closed and dropped: the next command makes one by the pool's settings."""
    client.connection_pool.disconnect()
    client.connection_pool.reset()
    if client.connection is not None:
        client.connection.disconnect()
        client.connection = None


class AppConfigData:
    """The appconfigdata client of a deployed function, serving infra/flags.json: the switch polls it as deployed."""

    def start_configuration_session(self, **identifiers) -> dict:
        return {"InitialConfigurationToken": "first"}

    def get_latest_configuration(self, ConfigurationToken: str) -> dict:  # noqa: N803 (boto3's name)
        flags = (benchlib.ROOT / "infra" / "flags.json").read_bytes()
        return {
            "Configuration": io.BytesIO(flags),
            "NextPollConfigurationToken": "next",
            "NextPollIntervalInSeconds": 15,
        }


def cpu_total(call: Callable[[], object], n: int = PER_SLICE) -> float:
    """CPU seconds `n` calls take."""
    started = time.process_time()
    for _ in range(n):
        call()
    return time.process_time() - started


def main() -> None:
    # Logs and metrics are on and written as on Lambda (stdout), here to a file; the table goes to the terminal.
    with tempfile.TemporaryFile("w+") as sink:
        with contextlib.redirect_stdout(sink), benchlib.redis_url() as url:
            os.environ.update(
                {
                    **benchlib.BASE_ENV,
                    "REDIS_URL": url,
                    "VQ_KEY_PREFIX": benchlib.bench_prefix(),
                    "POWERTOOLS_LOG_LEVEL": "INFO",
                    "VQ_APPCONFIG_APPLICATION": "virtual-queue",
                    "VQ_APPCONFIG_ENVIRONMENT": "bench",
                    "VQ_APPCONFIG_PROFILE": "flags",
                }
            )
            from chalicelib import aws

            aws.client = {"appconfigdata": AppConfigData()}.__getitem__  # the one AWS client a request reaches
            import redis.connection
            from chalice import Chalice

            from app import ENTRIES, app
            from chalicelib import runtime

            client = runtime.store().client
            # Timing, not the store's fail-fast budget: on a loaded machine a reply can take longer than 0.5 s.
            client.connection_pool.connection_kwargs["socket_timeout"] = 30
            client.connection_pool.reset()
            context = benchlib.LambdaContext()
            target = {"queue_type": "limited-drop", "target_id": "1"}
            me = ENTRIES + "/me"

            def call(handler, event, expected: str) -> None:
                answer = handler(event, context)
                assert expected in answer["body"], answer

            # User 2 waits in line behind more than a tick admits, and no pump runs, so every poll takes the waiting
            # path (the common one) and draws no grant (chalicelib/queue.py).
            for user in range(AHEAD):
                app(api_event("POST", ENTRIES, target, headers(f"ahead-{user}")), context)
            first = app(api_event("POST", ENTRIES, target, headers(2)), context)
            ticket = json.loads(first["body"])["queueTicket"]
            status_event = api_event("GET", me, target, headers(2, ticket))
            with benchlib.recorded(client) as commands:
                call(app, status_event, '"WAITING"')
            status_call = commands[-1]
            with benchlib.recorded(client) as commands:
                call(app, api_event("POST", ENTRIES, target, headers(SENTINEL)), '"WAITING"')
            enter_call = [str(arg) for arg in commands[-1]]

            # The framework's floor: Chalice routing an event to a view that makes the same script call.
            floor = Chalice(app_name="floor", configure_logs=False)

            @floor.route(me, methods=["GET"])
            def floor_status(queue_type, target_id):
                reply = client.execute_command(*status_call)
                return {"status": reply[0], "aheadCount": reply[2]}

            @floor.route(ENTRIES, methods=["POST"])
            def floor_enter(queue_type, target_id):
                user = floor.current_request.headers["x-user-id"]
                reply = client.execute_command(*[arg.replace(str(SENTINEL), user) for arg in enter_call])
                return {"status": reply[0], "aheadCount": reply[2]}

            # The identity modes: the same poll of a waiting user, named by X-User-Id or by a bearer JWT.
            from chalicelib.config import load_settings
            from chalicelib.identity import JwtIdentity
            from tests.support import jwts

            jwt_ticket = json.loads(app(api_event("POST", ENTRIES, target, headers(JWT_USER)), context)["body"])
            bearer = jwts.sign(jwts.realistic_claims(JWT_USER))
            jwt_headers = {k: v for k, v in headers(JWT_USER, jwt_ticket["queueTicket"]).items() if k != "X-User-Id"}
            jwt_event = api_event("GET", me, target, {**jwt_headers, "Authorization": f"Bearer {bearer}"})
            jwt_settings = load_settings({**os.environ, **jwts.jwt_env()}).jwt
            uncached = JwtIdentity(jwt_settings, retry_after_s=2)
            uncached.verify = lambda token: uncached._verify(token)[0]
            identities = {
                "header": (runtime.identity(), status_event),
                "jwt": (JwtIdentity(jwt_settings, retry_after_s=2), jwt_event),
                "jwt, no cache": (uncached, jwt_event),
            }
            deployed_identity = runtime.identity

            def poll_as(mode: str) -> float:
                """CPU of PER_SLICE status polls with the caller identified in `mode`."""
                identity, event = identities[mode]
                runtime.identity = lambda: identity  # every mode through the same one-line function
                try:
                    return cpu_total(lambda: call(app, event, '"WAITING"'))
                finally:
                    runtime.identity = deployed_identity

            users = iter(range(1_000, 10**9))
            requests = {
                "status": lambda handler: call(handler, status_event, '"WAITING"'),
                "enter": lambda handler: call(
                    handler, api_event("POST", ENTRIES, target, headers(next(users))), '"WAITING"'
                ),
            }
            hiredis = redis.connection.HIREDIS_AVAILABLE and not os.environ.get("BENCH_PURE_PYTHON_REDIS")
            if os.environ.get("BENCH_PURE_PYTHON_REDIS"):  # every measure without hiredis (a "before" figure)
                pure_python_redis(client).__enter__()

            spans = Spans()
            instrument(spans, client)
            overhead = calibrate()

            def one_round() -> dict[str, float]:
                """CPU per request of every measure: SLICES slices of PER_SLICE requests each, the measures taking
                turns slice by slice, so that a change of load on the machine meets them all alike."""
                found: dict[str, float] = defaultdict(float)
                for _ in range(SLICES):
                    for name, request in requests.items():
                        found[f"{name}: floor"] += cpu_total(lambda request=request: request(floor))
                        found[f"{name}: handler"] += cpu_total(lambda request=request: request(app))
                        if hiredis:
                            with pure_python_redis(client):
                                request(app)  # connects
                                found[f"{name}: handler, pure-Python redis-py"] += cpu_total(
                                    lambda request=request: request(app)
                                )
                        spans.reset()
                        with spans.installed():
                            for _ in range(PER_SLICE):
                                request(app)
                        for component in COMPONENTS:
                            spent = spans.seconds[component] - spans.calls[component] * overhead[component]
                            found[f"{name}: {component}"] += spent
                        found[f"{name}: Redis wait"] += spans.wait
                    for mode in IDENTITY_MODES:
                        found[f"status ({mode})"] += poll_as(mode)
                return {measure: total / (SLICES * PER_SLICE) for measure, total in found.items()}

            one_round()  # warm every path
            values, loads = benchlib.alternating({"round": one_round})
        sink.seek(0)
        assert '"level"' not in sink.read(), "a request logged: the measured path is not the quiet common one"

    rounds = values["round"]

    def per_round(measure: str, scale: float = 1e6) -> list[float]:
        return [r[measure] * scale for r in rounds]

    rows = {}
    for name in requests:
        handler, floor_cpu = per_round(f"{name}: handler"), per_round(f"{name}: floor")
        named = [sum(r[f"{name}: {c}"] for c in COMPONENTS) * 1e6 for r in rounds]
        row = {
            "handler_cpu_us": benchlib.spread(handler),
            "floor_cpu_us": benchlib.spread(floor_cpu),
            "x_floor": benchlib.ratios(handler, floor_cpu),
            "components_us": {
                "routing, middleware and the rest": benchlib.spread(
                    [h - n for h, n in zip(handler, named, strict=True)]
                ),
                **{c: benchlib.spread(per_round(f"{name}: {c}")) for c in COMPONENTS},
            },
            "redis_wait_us": benchlib.spread(per_round(f"{name}: Redis wait")),
        }
        if hiredis:
            pure = per_round(f"{name}: handler, pure-Python redis-py")
            row["handler_cpu_us_pure_python_redis"] = benchlib.spread(pure)
            row["hiredis_saves_us"] = benchlib.spread([p - h for p, h in zip(pure, handler, strict=True)])
        if name == "status":
            row["verdict"] = benchlib.verdict(row["x_floor"], TARGET_RATIO)
        rows[name] = row

    by_mode = {mode: per_round(f"status ({mode})") for mode in IDENTITY_MODES}
    identity = {
        "size_bytes_jwt": len(bearer),
        "handler_cpu_us": {mode: benchlib.spread(cpu) for mode, cpu in by_mode.items()},
        "x_header": {
            mode: benchlib.ratios(cpu, by_mode["header"]) for mode, cpu in by_mode.items() if mode != "header"
        },
        "target_ratio": JWT_TARGET_RATIO,
    }
    identity["verdict"] = benchlib.verdict(identity["x_header"]["jwt"], JWT_TARGET_RATIO)

    print(
        f"\nhandler CPU per request, median [range] of {benchlib.ROUNDS} rounds of {SLICES} alternating slices "
        f"of {PER_SLICE}, "
        f"load average {min(loads)}-{max(loads)}"
    )
    for name, row in rows.items():
        print(
            f"\n{name}: handler {benchlib.shown(row['handler_cpu_us'], ' us', 0)}, floor (minimal Chalice route) "
            f"{benchlib.shown(row['floor_cpu_us'], ' us', 0)}: {benchlib.shown(row['x_floor'])}  "
            f"{row.get('verdict', '')}"
        )
        for component, figure in row["components_us"].items():
            print(f"  {component:<36}{benchlib.shown(figure, ' us', 1):>24}")
        print(f"  {'Redis wait (wall, not CPU)':<36}{benchlib.shown(row['redis_wait_us'], ' us', 1):>24}")
        if "hiredis_saves_us" in row:
            print(
                f"  {'hiredis saves (against pure-Python redis-py)':<36}"
                f"{benchlib.shown(row['hiredis_saves_us'], ' us', 1):>24}"
            )
    print(f"\nstatus poll by identity mode (RS256 JWT of {len(bearer)} bytes):")
    for mode in IDENTITY_MODES:
        ratio = f"  x header {benchlib.shown(identity['x_header'][mode])}" if mode != "header" else ""
        verdict = f"  (<= {JWT_TARGET_RATIO}x: {identity['verdict']})" if mode == "jwt" else ""
        print(f"  {mode:<16}{benchlib.shown(identity['handler_cpu_us'][mode], ' us', 0):>24}{ratio}{verdict}")
    written = benchlib.write_json(
        "bench_request.json",
        {
            "rounds": benchlib.ROUNDS,
            "slices": SLICES,
            "per_slice": PER_SLICE,
            "target_ratio": TARGET_RATIO,
            "load_average": benchlib.loads(loads),
            "hiredis": hiredis and not os.environ.get("BENCH_PURE_PYTHON_REDIS"),
            "timer_overhead_us": {c: o * 1e6 for c, o in overhead.items()},
            "requests": rows,
            "identity": identity,
        },
    )
    print(f"\nwrote {written.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
