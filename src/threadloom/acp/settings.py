"""A session's settings as ACP shows them: session config options (the runtime mode and the model) and the
older session modes API, both read from the thread and changed through the API like any client's change.

Pure: what the editor is shown for a thread's `mode` and `model`, and what a value it picks means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MODE_OPTION = "mode"
MODEL_OPTION = "model"
DEFAULT_MODEL = "default"  # the model option's value for "the provider instance's default" (thread.model null)

# The thread's runtime modes, as the editor lists them: (value, RuntimeMode, name, description).
MODES = (
    ("workspace_write", "WORKSPACE_WRITE", "Workspace write", "No prompts; writes in the workspace, no network"),
    ("approval_required", "APPROVAL_REQUIRED", "Ask first", "Every command and file change asks for approval first"),
    ("read_only", "READ_ONLY", "Read only", "Reads the workspace; nothing is written"),
    ("full_access", "FULL_ACCESS", "Full access", "No prompts, a network; only where the server allows it"),
)
_BY_VALUE = {value: enum for value, enum, _, _ in MODES}
_BY_ENUM = {enum: value for value, enum, _, _ in MODES}


class UnknownSetting(ValueError):
    """A config option or value the session does not have."""


def mode_value(runtime_mode: str) -> str:
    """The option value of a thread's `mode` (a RuntimeMode name)."""
    return _BY_ENUM.get(runtime_mode, runtime_mode.lower())


def runtime_mode(value: str) -> str:
    """The RuntimeMode a mode value names; UnknownSetting for another."""
    try:
        return _BY_VALUE[value]
    except KeyError:
        raise UnknownSetting(f"no runtime mode {value!r}: one of {', '.join(_BY_VALUE)}") from None


def model_value(value: str) -> str | None:
    """The model a model value names (None: the instance's default); a blank one is UnknownSetting."""
    cleaned = value.strip()
    if not cleaned:
        raise UnknownSetting("a model needs a name")
    return None if cleaned == DEFAULT_MODEL else cleaned


def config_options(mode: str, model: str | None, models: Sequence[str]) -> list[dict[str, Any]]:
    """The session's config options: its runtime mode and its model (the offered models, and the current one)."""
    mode_options = [{"value": value, "name": name, "description": text} for value, _, name, text in MODES]
    current_model = model or DEFAULT_MODEL
    names = [DEFAULT_MODEL, *(m for m in models if m != DEFAULT_MODEL)]
    if current_model not in names:
        names.append(current_model)
    model_options = [{"value": name, "name": "Provider default" if name == DEFAULT_MODEL else name} for name in names]
    return [
        {
            "type": "select",
            "id": MODE_OPTION,
            "name": "Runtime mode",
            "description": "What the agent may do in the thread's next runs",
            "category": "mode",
            "currentValue": mode_value(mode),
            "options": mode_options,
        },
        {
            "type": "select",
            "id": MODEL_OPTION,
            "name": "Model",
            "description": "The model of the thread's next runs",
            "category": "model",
            "currentValue": current_model,
            "options": model_options,
        },
    ]


def modes_state(mode: str) -> dict[str, Any]:
    """The same runtime mode through ACP's older session modes API (`modes`, `session/set_mode`)."""
    return {
        "currentModeId": mode_value(mode),
        "availableModes": [{"id": value, "name": name, "description": text} for value, _, name, text in MODES],
    }
