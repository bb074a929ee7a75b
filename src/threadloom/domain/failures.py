"""Why a failed run failed, as a stable code: `Run.failureCode` (GraphQL `Run.failure`).

`statusReason` says it in words (for a failure the agent reported, the agent's own message); a client
needs a code it can act on instead: ask for a new API key, wait and send again, or report a bug. Every
FAILED run gets one, decided when the run ends (`failure_code`) and recorded with it, so the event log
replays it as it was decided.

The MODEL_* codes say the model API refused or broke the request. Each driver reads them from what its CLI
reports (`ModelFailure`: Codex's `codexErrorInfo`, Claude Code's `api_error_status`), with the HTTP status
when the CLI tells it; `of_http_status` is the one rule both use for a status. The others come from the
reason the engine ended the run with.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum


class RunFailureCode(StrEnum):
    MODEL_AUTH_FAILED = "MODEL_AUTH_FAILED"  # 401/403: the API key was refused
    MODEL_RATE_LIMITED = "MODEL_RATE_LIMITED"  # 429: too many requests, or the account's quota is used up
    MODEL_OVERLOADED = "MODEL_OVERLOADED"  # 529: the API is over capacity
    MODEL_SERVER_ERROR = "MODEL_SERVER_ERROR"  # 5xx: the API failed
    MODEL_STREAM_CUT = "MODEL_STREAM_CUT"  # the reply's stream broke off before it was complete
    MODEL_REQUEST_FAILED = "MODEL_REQUEST_FAILED"  # another refusal of the request (a 4xx, the model unknown ...)
    AGENT_ERROR = "AGENT_ERROR"  # the agent reported a failure that is not one of the above
    AGENT_EXITED = "AGENT_EXITED"  # the agent process exited during the turn
    PROVIDER_REFUSED = "PROVIDER_REFUSED"  # the agent refused to start the turn
    SERVER_LOST = "SERVER_LOST"  # the server holding the turn stopped or went away
    WORKSPACE_ERROR = "WORKSPACE_ERROR"  # the thread's workspace could not be prepared


MODEL_CODES = frozenset(code for code in RunFailureCode if code.startswith("MODEL_"))

# The engine's reasons (`Run.statusReason`) for failures it decides itself.
REASON_CODES = {
    "provider_crashed": RunFailureCode.AGENT_EXITED,
    "provider_error": RunFailureCode.PROVIDER_REFUSED,
    "provider_lost": RunFailureCode.SERVER_LOST,
    "server_stopped": RunFailureCode.SERVER_LOST,
    "workspace_error": RunFailureCode.WORKSPACE_ERROR,
}


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFailure:
    """A driver's reading of a failed turn: the model API failed it (`code` is a MODEL_* code)."""

    code: RunFailureCode
    http_status: int | None = None


def of_http_status(status: int | None) -> RunFailureCode | None:
    """The code of a model API's HTTP error status; None for no status or one that is not an error."""
    if status is None or status < 400:
        return None
    if status in (401, 403):
        return RunFailureCode.MODEL_AUTH_FAILED
    if status == 429:
        return RunFailureCode.MODEL_RATE_LIMITED
    if status == 529:
        return RunFailureCode.MODEL_OVERLOADED
    if status >= 500:
        return RunFailureCode.MODEL_SERVER_ERROR
    return RunFailureCode.MODEL_REQUEST_FAILED


def model_failure(status: int | None) -> ModelFailure | None:
    code = of_http_status(status)
    return None if code is None else ModelFailure(code, status)


def failure_code(reason: str | None, model: ModelFailure | None) -> RunFailureCode:
    """The code of a run that ends FAILED with `reason`: the driver's model failure when it read one,
    else the engine's reason's, else AGENT_ERROR (the agent said it failed, in its own words)."""
    if model is not None:
        return model.code
    return REASON_CODES.get(reason or "", RunFailureCode.AGENT_ERROR)
