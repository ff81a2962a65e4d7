"""Routes and Lambda entry points of the virtual waiting room; all logic lives in chalicelib/."""

import functools
import os

from chalice import Chalice, Response

from chalicelib import runtime
from chalicelib.errors import QueueError
from chalicelib.targets import parse_target, parse_user_id

app = Chalice(app_name="virtual-queue", configure_logs=False)

# Refuse to start without signing keys. The Chalice CLI imports this module only to read the
# routes (package, deploy), without the runtime's secrets, so it is spared the check.
if not os.environ.get("AWS_CHALICE_CLI_MODE"):
    runtime.settings()

ENTRIES = "/virtual-queues/{queue_type}/{target_id}/entries"


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
    return Response(body=body, status_code=status, headers={"Content-Type": "application/json", **(headers or {})})


def _header(name):
    return app.current_request.headers.get(name)


@app.route(ENTRIES, methods=["POST"])
@answers_queue_errors
def enter(queue_type, target_id):
    target = parse_target(queue_type, target_id)
    entry = runtime.waiting_room().enter(target, parse_user_id(_header("x-user-id")))
    return entry.to_body()


@app.route(ENTRIES + "/me", methods=["GET"])
@answers_queue_errors
def status(queue_type, target_id):
    target = parse_target(queue_type, target_id)
    user_id = parse_user_id(_header("x-user-id"))
    return runtime.waiting_room().status(target, user_id, _header("x-queue-ticket")).to_body()


@app.route(ENTRIES + "/me", methods=["DELETE"])
@answers_queue_errors
def leave(queue_type, target_id):
    target = parse_target(queue_type, target_id)
    runtime.waiting_room().leave(target, parse_user_id(_header("x-user-id")), _header("x-queue-ticket"))
    return Response(body="", status_code=204)
