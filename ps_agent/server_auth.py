"""What a client of the served graph may do besides starting a run with a question: LangGraph Server's auth.

The graph checks what a run brings (its question and its context) in its first node, ``prepare``. LangGraph Server
also lets a client reach the nodes past ``prepare``: send a run a ``command`` (``goto`` a node, ``update`` the
state), start a run with no input (it goes on from the thread's last checkpoint), or edit a thread's state
(``POST /threads/{id}/state``); a cron starts runs the same ways. ``langgraph.json`` loads ``auth``, whose handlers
refuse each with a 403 that says what the server takes instead. A run that starts with an input starts afresh at
``prepare``, whatever the thread held (``state.fresh_run``). Any client's run or cron, the operator's too, is refused
with a 422 when its input holds more than a question or its ``context`` a setting the graph does not have: the
server would drop those silently, and the run go on with defaults.

Two kinds of client keep them all, as the operator: LangGraph Studio (its LangSmith sign-in; ``langgraph dev``
takes Studio's header from anyone who can reach it, so bind it to 127.0.0.1), and a client whose authentication
grants the permission ``STEER``. The ``authenticate`` here lets every client in as ``anonymous``, as the server
does with no auth. An operator who authenticates clients writes their own ``Auth`` and registers the handlers on it:

    auth = Auth()
    auth.on.threads.create_run(refuse_unchecked_runs)
    auth.on.crons.create(refuse_unchecked_crons)
    auth.on.threads.update(refuse_state_edits)
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from langgraph_sdk import Auth
from langgraph_sdk.auth import is_studio_user

from ps_agent.configuration import AgentConfig, unknown_setting

STEER = "ps_agent:steer"  # the permission that lets a client send commands and edit state
EXPECTED = 'start a run with an input, {"question": "..."}'

auth = Auth()


@auth.authenticate
async def authenticate() -> Auth.types.MinimalUserDict:
    """Every client, as the server takes them with no auth: anonymous, without ``STEER``."""
    return {"identity": "anonymous", "is_authenticated": False, "permissions": []}


@auth.on
async def open_otherwise(ctx: Auth.types.AuthContext, value: Any) -> None:
    """Every other request stays as with no auth (without a handler, the server warns of one missing per path)."""


def _steers(ctx: Auth.types.AuthContext) -> bool:
    return is_studio_user(ctx.user) or STEER in ctx.permissions


def _refused(what: str) -> Auth.exceptions.HTTPException:
    return Auth.exceptions.HTTPException(
        status_code=403,
        detail=f"{what} would skip the graph's checks of a run: this server does not take it; {EXPECTED}",
    )


def _unchecked(run: dict[str, Any]) -> str | None:
    """What in a run's request would skip ``prepare``, if anything."""
    if run.get("command") is not None:
        return "a run's `command`"
    if run.get("input") is None:
        return "a run with no input (it goes on from the thread's last checkpoint)"
    return None


SETTINGS = [f.name for f in fields(AgentConfig)]  # what a run's context may set (its llm and corpus by name)


def _malformed(run: dict[str, Any], context: dict[str, Any] | None) -> str | None:
    """What in a run's request the graph would not take as sent, if anything: the server drops a ``context`` key
    its schema lacks (a misspelt ``max_turn``) and the graph reads only an input's ``question``, so the run would
    go on with defaults and the client never learn."""
    given = run.get("input")
    if given is not None and (not isinstance(given, dict) or given.keys() != {"question"}):
        got = f"the keys {sorted(map(str, given))}" if isinstance(given, dict) else f"a {type(given).__name__}"
        return f'its input is {{"question": "..."}} and nothing else; got {got}'
    wrong = unknown_setting(context, SETTINGS) if isinstance(context, dict) else None
    return f"its context has an {wrong}" if wrong else None


def _check(steers: bool, request: dict[str, Any], context: dict[str, Any] | None, cron: bool) -> None:
    if not steers and (unchecked := _unchecked(request)):
        raise _refused(f"a cron of {unchecked}" if cron else unchecked)
    if malformed := _malformed(request, context):
        raise Auth.exceptions.HTTPException(status_code=422, detail=f"{'a cron' if cron else 'a run'}: {malformed}")


@auth.on.threads.create_run
async def refuse_unchecked_runs(ctx: Auth.types.AuthContext, value: Auth.types.RunsCreate) -> None:
    """A run that starts with an input starts at ``prepare``; one with a ``command`` or no input does not. Any
    client's run is refused (422) when the graph would not take its input or its ``context`` as sent. (A
    ``configurable`` may hold a client's other keys, LangChain's shared namespace: the server marks a run whose
    client sent a ``context``, and only that is checked.)"""
    run = value.get("kwargs") or {}
    sent_context = ((run.get("config") or {}).get("configurable") or {}).get("__context_provided__")
    _check(_steers(ctx), run, run.get("context") if sent_context else None, cron=False)


@auth.on.crons.create
async def refuse_unchecked_crons(ctx: Auth.types.AuthContext, value: Auth.types.CronsCreate) -> None:
    """A cron's runs, started later by the server, as its request's run would be."""
    payload = value.get("payload") or {}
    _check(_steers(ctx), payload, payload.get("context"), cron=True)


@auth.on.threads.update
async def refuse_state_edits(ctx: Auth.types.AuthContext, value: Auth.types.ThreadsUpdate) -> None:
    """Editing a thread's state arrives as an update that names only the thread; a metadata patch carries
    ``metadata`` and a cancelled run its ``action``, and both stay open."""
    if _steers(ctx) or value.keys() - {"thread_id"}:
        return
    raise _refused("an edit of a thread's state")
