"""Resolving a Machine's environment at `vz up` time.

Literal values come from vz.json; secret references (``{"from_env": "VAR"}``) are read from the caller's
environment, now, and only travel to the driver in RunImage. They are never written to the state store and
never printed: every resolved value is registered with a ``Redactor`` that cleans error messages.
"""

from __future__ import annotations

from collections.abc import Mapping

from vz_core.env._definition import Machine, SecretRef
from vz_core.errors import UserError
from vz_core.redact import Redactor

__all__ = ["resolve_environment"]


def resolve_environment(
    machine: Machine, environ: Mapping[str, str], *, json_path: str, redactor: Redactor
) -> dict[str, str]:
    """The Machine's environment with secret references resolved; missing variables fail before mutation."""
    out: dict[str, str] = {}
    missing: list[str] = []
    for key, value in machine.environment.items():
        if isinstance(value, SecretRef):
            secret = environ.get(value.from_env)
            if secret is None:
                missing.append(f"{json_path}.{key} needs ${value.from_env}")
                continue
            redactor.add(secret)
            if "\x00" in secret:  # the value itself is never shown
                raise UserError(
                    f"{json_path}.{key}: ${value.from_env} contains a NUL character, which no environment can hold; "
                    "fix the variable in the environment that runs `vz up`"
                )
            out[key] = secret
        else:
            out[key] = value
    if missing:
        raise UserError(
            "secret references cannot be resolved: "
            + "; ".join(missing)
            + " (set those variables in the environment that runs `vz up`)"
        )
    return out
