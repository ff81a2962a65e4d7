"""Routes and Lambda entry points of the virtual waiting room; all logic lives in chalicelib/."""

import gc

# Cold start: collections while the modules load free nothing and scan every object loaded so far (a full one
# costs about as much as importing our own modules). Frozen at the end, those objects stay out of the
# collections that run on requests.
gc.disable()

import functools
import os
import time

import orjson
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.jmespath_utils import query
from chalice import Chalice, ConvertToMiddleware, CustomAuthorizer, IAMAuthorizer, Response

from chalicelib import gate, media_types, page, runtime
from chalicelib.errors import QueueError, UnknownTarget, chalice_refusal
from chalicelib.identity import page_identity
from chalicelib.observability import (
    add_request_keys,
    close_request_keys,
    count,
    lambda_context_keys,
    logger,
    metrics,
    open_request_keys,
    tracer,
)
from chalicelib.purchase import PurchaseRequest
from chalicelib.target_config import Precondition, parse_config, parse_patch
from chalicelib.targets import TARGET_TYPES, TargetType, parse_target

app = Chalice(app_name="virtual-queue", configure_logs=False)
# No route takes or answers binary media: bodies are JSON (a route that reads one refuses any other Content-Type
# with 415: `_json_body`), pages and scripts text. Without Chalice's 16 default binary types, API Gateway declares
# none, and Chalice no longer matches every answer's Content-Type and the request's Accept against them (three
# times a request).
app.api.binary_types = []

# Refuse to start on a malformed configuration (no network: keys in Secrets Manager are read on first use, so
# a cold start that cannot reach them answers 503 and heals; tokens.py). The Chalice CLI imports this module
# only to read the routes (package, deploy), without the runtime's settings, so it is spared the check.
if not os.environ.get("AWS_CHALICE_CLI_MODE"):
    runtime.settings()
    # In jwt mode: the identity provider's keys, checked (VQ_JWKS) or first fetched (VQ_JWKS_URL) from the start.
    runtime.identity()


@app.middleware("http")
def correlate_logs(request, get_response):
    """Every route logs JSON with the API Gateway request id as correlation id, and nothing of the previous
    request. (Powertools' inject_lambda_context, rebuilt around each request by ConvertToMiddleware, does
    this and adds the Lambda context's fields at several times the cost; the request id already names the
    invocation.) The keys join a line only when one is written. The request itself is never logged: it
    carries tickets and tokens."""
    keys = open_request_keys(correlation_id=request.context.get("requestId"))
    try:
        return get_response(request)
    finally:
        close_request_keys(keys)


@app.middleware("http")
def guarded_answers(request, get_response):
    """No answer of the API may be kept by a cache between the client and the API: answers carry tickets and
    entry tokens, and are one user's at one moment. Errors too, Chalice's own (405, 500) included; the pages set
    their own rule (`_html`). (API Gateway's own answers get the header from infra/edge.yaml.) And a browser runs
    none as anything but the type it names (`nosniff`): pages, scripts, and the shop's answer to a purchase,
    passed on with whatever Content-Type the shop chose."""
    response = get_response(request)
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@app.middleware("http")
def errors_in_one_shape(request, get_response):
    """Chalice refuses a method a route does not take (405, with `Allow`) before any route runs, as `{"Code",
    "Message"}`: it goes out as every other error, `{"code", "detail"}`. (Its 415 is switched off: see the end.)"""
    response = get_response(request)
    refusal = chalice_refusal(response.body)
    if refusal is not None:
        response.body = _json_text(refusal.body())
        response.headers["Content-Type"] = "application/json"
    return response


# Traced when X-Ray is on.
if tracer is not None:
    app.register_middleware(ConvertToMiddleware(tracer.capture_lambda_handler), "http")

QUEUE = "/virtual-queues/{queue_type}/{target_id}"
ENTRIES = QUEUE + "/entries"


def answers_queue_errors(view):
    """Answer JSON: a view's dict as 200, a QueueError as `{"code", "detail"}` with the error's status."""

    @functools.wraps(view)
    def answer(*args, **kwargs):
        try:
            result = view(*args, **kwargs)
        except QueueError as err:
            return _json(err.body(), err.status, err.headers)
        return result if isinstance(result, Response) else _json(result)

    return answer


def _json(body, status=200, headers=None):
    return Response(
        body=_json_text(body), status_code=status, headers={"Content-Type": "application/json", **(headers or {})}
    )


def _json_text(body):
    """`body` as compact JSON text, non-ASCII as UTF-8. orjson rather than Chalice's json.dumps, which builds an
    encoder for every answer: a poll's answer costs a third of the time (tests/perf/bench_request.py, JSON)."""
    return orjson.dumps(body).decode()


def _header(name):
    return app.current_request.headers.get(name)


def _json_body(accepted=media_types.JSON):
    """The request's body, once its Content-Type says it is one of `accepted` (chalicelib/media_types.py)."""
    media_types.require(_header("content-type"), accepted)
    return app.current_request.raw_body


def _target(queue_type, target_id):
    target = parse_target(queue_type, target_id)
    add_request_keys(target=target)
    return target


def _caller():
    """Who is calling (chalicelib/identity.py: X-User-Id, or a verified bearer JWT)."""
    caller = runtime.identity().caller(app.current_request.headers)
    add_request_keys(user_id=caller.user_id)
    return caller


@app.route(ENTRIES, methods=["POST"])
@answers_queue_errors
def enter(queue_type, target_id):
    target = _target(queue_type, target_id)
    caller = _caller()
    return runtime.waiting_room().enter(target, caller.user_id, caller.invited_to(target)).to_body()


@app.route(ENTRIES + "/me", methods=["GET"])
@answers_queue_errors
def status(queue_type, target_id):
    target = _target(queue_type, target_id)
    return runtime.waiting_room().status(target, _caller().user_id, _header("x-queue-ticket")).to_body()


@app.route(ENTRIES + "/me", methods=["DELETE"])
@answers_queue_errors
def leave(queue_type, target_id):
    target = _target(queue_type, target_id)
    runtime.waiting_room().leave(target, _caller().user_id, _header("x-queue-ticket"))
    return Response(body="", status_code=204)


# The line's public state is the same for everyone for a second: the edge answers it, and keeps answering it through
# a short outage of Redis (docs/api.md#far-back-read-the-line-not-your-place).
LINE_CACHE = "public, max-age=1, stale-while-revalidate=5, stale-if-error=60"
# An unknown target briefly too, so a flood of them costs the origin little.
UNKNOWN_LINE_CACHE = "public, max-age=5"


@app.route(QUEUE + "/line", methods=["GET"])
def line(queue_type, target_id):
    """One answer for everyone: reads no header, ticket or JWT, and costs one GET of what the pump wrote."""
    try:
        stored = runtime.waiting_room().line(parse_target(queue_type, target_id))
    except QueueError as err:
        cache = UNKNOWN_LINE_CACHE if isinstance(err, UnknownTarget) else "no-store"
        return _json(err.body(), err.status, {**err.headers, "Cache-Control": cache})
    # The answer's own time beside the pump's, spliced in rather than parsed and written again.
    body = f'{{"serverTimeMs":{int(time.time() * 1000)},{stored[1:]}'
    return Response(
        body=body, status_code=200, headers={"Content-Type": "application/json", "Cache-Control": LINE_CACHE}
    )


@app.route(QUEUE + "/stats", methods=["GET"], authorizer=IAMAuthorizer())
@answers_queue_errors
def stats(queue_type, target_id):
    return runtime.waiting_room().stats(_target(queue_type, target_id))


@app.route(QUEUE + "/config", methods=["GET"], authorizer=IAMAuthorizer())
@answers_queue_errors
def get_config(queue_type, target_id):
    return _config_answer(runtime.waiting_room().config(_target(queue_type, target_id)))


@app.route(QUEUE + "/config", methods=["PUT"], authorizer=IAMAuthorizer())
@answers_queue_errors
def put_config(queue_type, target_id):
    target = _target(queue_type, target_id)
    config = parse_config(_json_body())
    return _config_answer(runtime.waiting_room().configure(target, config, _precondition()))


@app.route(QUEUE + "/config", methods=["PATCH"], authorizer=IAMAuthorizer())
@answers_queue_errors
def patch_config(queue_type, target_id):
    target = _target(queue_type, target_id)
    patch = parse_patch(_json_body(media_types.MERGE_PATCH))
    return _config_answer(runtime.waiting_room().patch_config(target, patch, _precondition()))


def _precondition():
    return Precondition.parse(_header("if-match"), _header("if-none-match"))


def _config_answer(answer):
    return _json(answer.body, headers={"ETag": f'"{answer.etag}"'})


# --- purchase gate ---


@app.lambda_function(name="purchase_authorizer")
def purchase_authorizer(event, context):
    """API Gateway REQUEST authorizer of the purchase routes: Allow exactly this method ARN for a valid
    entry token of the route's target and the caller (chalicelib/identity.py), else Deny; a caller without a valid
    JWT is let through to the route, which answers 401 (gate.Verdict). Needs no Redis. Raises only when the
    identity provider's keys cannot be had, for API Gateway's AUTHORIZER_FAILURE answer, a 503
    (infra/authorizer.yaml)."""
    verdict = gate.authorize(runtime.signer(), runtime.identity(), event, time.time(), runtime.switch().queue_enabled)
    if verdict.refusal == "unavailable":
        raise RuntimeError("the identity provider's keys cannot be had")
    if not verdict.allowed and not verdict.keys_unavailable:  # that one the signer counted already
        # Only a denial logs, so only a denial gathers what its line carries: the request id and the function's
        # context (Powertools' inject_lambda_context on every call cost a third of an Allow). The event is never
        # logged: it carries the entry token.
        keys = open_request_keys(
            correlation_id=query(event, correlation_paths.API_GATEWAY_REST), **lambda_context_keys(context)
        )
        try:
            count("BypassDenied")  # for the whole service only: the target is the caller's word (a metric each)
            logger.info("purchase denied", extra={"target": str(verdict.target) if verdict.target else None})
        finally:
            close_request_keys(keys)
    return verdict.policy


# Deployed, API Gateway runs `purchase_authorizer` before the purchase routes. Chalice can only describe a
# TOKEN authorizer, so infra/authorizer.yaml rewrites this one into a REQUEST authorizer and points it at the
# function (the URI below is a placeholder). Locally no custom authorizer runs: the routes identify the caller
# and check the token themselves either way.
PURCHASE_AUTHORIZER = CustomAuthorizer(
    "purchase_authorizer",
    authorizer_uri="set-by-infra/authorizer.yaml",
    ttl_seconds=0,
    header="X-Entry-Token",
)


def _purchase(target_type, target_id):
    request = app.current_request
    answer = runtime.purchase_gate().purchase(
        PurchaseRequest(
            target_type=target_type,
            target_id=target_id,
            entry_token=request.headers.get("x-entry-token"),
            user_id=_caller().user_id,
            authorizer=request.context.get("authorizer"),
            body=request.raw_body,
            content_type=request.headers.get("content-type"),
            request_id=request.context.get("requestId"),
        )
    )
    headers = {"Content-Type": answer.content_type} if answer.content_type else {}
    return Response(body=answer.text, status_code=answer.status, headers=headers)


def _purchase_route(kind: TargetType) -> None:
    """The purchase route of target type `kind` (targets.py), which purchase_authorizer guards deployed."""

    def purchase(**path):
        return _purchase(kind.name, path[kind.id_parameter])

    purchase.__name__ = purchase.__qualname__ = "purchase_" + kind.name.replace("-", "_")
    app.route(kind.purchase_path, methods=["POST"], authorizer=PURCHASE_AUTHORIZER)(answers_queue_errors(purchase))


for _kind in TARGET_TYPES.values():
    _purchase_route(_kind)


# --- admission pump ---

# What the pump saw applied per target (chalicelib/pump.py), kept while the container stays warm: a failover between
# two invocations is fenced too.
_PUMP_SEEN: dict = {}


@app.lambda_function(name="admission_pump")
@logger.inject_lambda_context
@metrics.log_metrics
def admission_pump(event, context):
    """Every minute from EventBridge (infra/pump.yaml): tick until shortly before the deadline, or return at
    once while no target is registered or open. `{"ticks": N}` runs exactly N ticks. Answers the run's totals."""
    # Loaded here, not with the routes: the API's functions never run the pump, and load this module cold.
    from chalicelib.pump import Pump, ticks_requested

    pump = Pump(runtime.store(), runtime.settings(), publisher=runtime.publisher(), seen=_PUMP_SEEN)
    run = pump.run(ticks_requested(event), remaining_ms=context.get_remaining_time_in_millis, until_idle=True)
    return run.to_body()


# --- the switch's fast route ---


@app.lambda_function(name="flag_sync")
@logger.inject_lambda_context(log_event=False)
def flag_sync(event, context):
    """AppConfig extension of the flag's profile (infra/appconfig.yaml): writes every deployed flag
    configuration into the queue's store, where the next enter or status of each target finds it."""
    from chalicelib.flag_sync import sync as sync_flag  # as the pump's: only this function uses it

    return sync_flag(event, runtime.store, runtime.deployed_flag)


# --- web pages: the waiting room, the operator console ---

WAITING_ROOM = "/waiting-room/{queue_type}/{target_id}"
CONSOLE = "/console"


def _html(served: page.Page):
    # Per language (Accept-Language), and revalidated on every load: the page carries the target's current display
    # fields. Its policy lets only its own scripts run, and no other site frame it (docs/pages.md).
    return Response(
        body=served.html,
        status_code=200,
        headers={
            "Content-Type": "text/html; charset=utf-8",
            "Cache-Control": "no-cache",
            "Vary": "Accept-Language",
            "Content-Security-Policy": served.content_security_policy,
            "Referrer-Policy": "no-referrer",
        },
    )


@app.route(WAITING_ROOM, methods=["GET"])
@answers_queue_errors
def waiting_room_page(queue_type, target_id):
    """The waiting-room web page of one line (HTML and script, same origin as the API), in Korean or English."""
    target = _target(queue_type, target_id)
    lang = page.language(_header("accept-language"), (app.current_request.query_params or {}).get("lang"))
    return _html(
        page.render(
            target,
            lang,
            runtime.waiting_room().display(target),
            page_path=WAITING_ROOM.format(queue_type=target.type, target_id=target.id),
            purchase_path=gate.purchase_path(target),
            identity=page_identity(runtime.settings()),
        )
    )


@app.route(page.LIBRARY_PATH, methods=["GET"])
def waiting_room_library():
    """The client library the waiting room runs on (clients/js/'s bundle): revalidated like the page it serves."""
    return Response(
        body=page.library(),
        status_code=200,
        headers={"Content-Type": "text/javascript; charset=utf-8", "Cache-Control": "no-cache"},
    )


@app.route(page.SERVICE_WORKER_PATH, methods=["GET"])
def waiting_room_service_worker():
    """The waiting room's service worker (a reload while the server is down shows the page it last served)."""
    return Response(
        body=page.service_worker(),
        status_code=200,
        headers={"Content-Type": "text/javascript; charset=utf-8", "Cache-Control": "no-cache"},
    )


@app.route("/virtual-queues", methods=["GET"], authorizer=IAMAuthorizer())
@answers_queue_errors
def list_targets():
    """The targets with users in line or in a pre-queue (operators)."""
    return {"targets": [{"type": t.type, "id": str(t.id)} for t in runtime.waiting_room().targets()]}


@app.route(CONSOLE, methods=["GET"], authorizer=IAMAuthorizer())
def operator_console():
    """The operator console: live charts of every target and the controls of its configuration. Behind IAM
    like the operator routes it calls (docs/pages.md)."""
    return _html(page.console(page_path=CONSOLE, queues_path="/virtual-queues"))


# Chalice's own media-type check is loose and answers in its own shape (chalicelib/media_types.py): every route lets
# every Content-Type through, and those that read a body check it exactly (`_json_body`, the purchase gate).
for _methods in app.routes.values():
    for _route in _methods.values():
        _route.content_types = ["*/*"]

# Loaded (see the top): what the modules made lives as long as the container.
gc.freeze()
gc.enable()
