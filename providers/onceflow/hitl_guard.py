"""A HITL form field required for some options only: the review's note, needed to Reject, not to Approve.

Airflow 3.3's Human-in-the-loop form marks a param required when its type does not allow null,
for every option at once: a required ``note`` greys out Approve too, an optional one lets a
rejection go through with no reason. The options are not part of the params' JSON schema
(``"_options"`` is refused as a param name), so no schema can say "required when Reject".

A param says it here with the schema key :data:`REQUIRED_FOR_KEY` (``Param(None, type=["null",
"string"], **{REQUIRED_FOR_KEY: ["Reject"]})``; JSON Schema and the form ignore keys they do not
know). :class:`RequiredForOptionGuard`, an api-server root middleware that
:class:`~onceflow.priority.OnceflowPriorityPlugin` installs, reads the stored request of the task
(``hitl_detail.params``) when a response arrives through the public API
(``PATCH .../taskInstances/{task_id}/{map_index}/hitlDetails``) and refuses one that chooses such an
option with the field empty, before Airflow records the response: the task keeps waiting and the
reviewer can answer again.

The status is :data:`REFUSAL_STATUS` (449, "Retry With") on purpose: the UI's generated client
shows only the standard reason phrase for a standard code ("Bad Request"), and shows the body for
any other, so this code is the one whose message the reviewer reads in the "Response failed"
toast. The operator keeps its own fallback for a response that reaches it another way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from onceflow.local_api_guard import ASGIApp, Message, Receive, Scope, Send, send_response

#: The param schema key that lists the options the field is required for.
REQUIRED_FOR_KEY = "x-onceflow-required-for"
#: Not in the UI's table of standard codes, so the toast shows the body's ``detail`` (see above).
REFUSAL_STATUS = 449
_RESPONSE_PATH = re.compile(
    r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/(?P<run_id>[^/]+)/taskInstances/(?P<task_id>[^/]+)"
    r"/(?P<map_index>-?\d+)/hitlDetails/?$"
)


def missing_required(params: Mapping[str, Any], chosen: list[str], answers: Mapping[str, Any]) -> list[str]:
    """Names of the fields that the ``chosen`` options require and ``answers`` leaves empty.

    :param params: the stored request's serialized params (``name -> {"schema": ..., ...}``).
    :param chosen: the options the response chooses.
    :param answers: the response's ``params_input``.
    """
    missing = []
    for name, spec in params.items():
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        needs = (schema or {}).get(REQUIRED_FOR_KEY) or []
        if set(needs) & set(chosen) and not str(answers.get(name) or "").strip():
            missing.append(name)
    return missing


def refusal_text(missing: list[str], chosen: list[str]) -> str:
    """The message a reviewer reads: which field, for which option, and that the task still waits."""
    fields = ", ".join(repr(m) for m in missing)
    return (
        f"{' and '.join(chosen)} needs {fields}: type why in the form's {fields} field and answer "
        "again (the task is still waiting; nothing was recorded)"
    )


def _stored_params(dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, Any] | None:
    """The params of the task's pending HITL request, or None (no request, or already answered)."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.execute(
            select(HITLDetail.params, HITLDetail.chosen_options)
            .join(TaskInstance, TaskInstance.id == HITLDetail.ti_id)
            .where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == map_index,
            )
        ).first()
    if row is None or row.chosen_options:
        return None  # Airflow answers these itself (404, 409)
    return dict(row.params or {})


class RequiredForOptionGuard:
    """ASGI middleware: refuse a HITL response that leaves empty a field its chosen option requires.

    :param app: the api-server's ASGI app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _RESPONSE_PATH.search(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "PATCH":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        problem = await _problem(match.groupdict(), body)
        if problem is not None:
            await send_response(
                send, REFUSAL_STATUS, b"application/json", json.dumps({"detail": problem}).encode()
            )
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _problem(path: dict[str, str], body: bytes) -> str | None:
    try:
        payload = json.loads(body or b"{}")
        chosen = [str(o) for o in payload.get("chosen_options") or []]
        answers = payload.get("params_input") or {}
    except (ValueError, AttributeError, TypeError):
        return None  # Airflow's own validation answers a malformed body (422)
    if not chosen or not isinstance(answers, Mapping):
        return None
    from anyio import to_thread

    # ASGI's path is already percent-decoded
    params = await to_thread.run_sync(
        _stored_params, path["dag_id"], path["run_id"], path["task_id"], int(path["map_index"])
    )
    missing = missing_required(params or {}, chosen, answers)
    return refusal_text(missing, chosen) if missing else None
