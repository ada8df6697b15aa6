"""Immutable identifiers of projects, Environments and Machines.

Ids are generated once and never change; human names are only selectors. Generated ids contain an underscore
(``env_…``, ``mch_…``) and names may not, so a selector is never both a valid name and a valid id.
"""

from __future__ import annotations

import re
import secrets

__all__ = [
    "ENV_ID_RE",
    "MACHINE_ID_RE",
    "NAME_RE",
    "PROJECT_ID_RE",
    "looks_like_env_id",
    "looks_like_machine_id",
    "new_env_id",
    "new_machine_id",
    "new_operation_id",
    "workspace_id",
]

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lowercase: no i, l, o, u
_ID_LEN = 12

# The patterns are also JSON Schema / pydantic patterns, where "$" means the end of the text. In Python "$" also
# matches before a trailing newline, so Python code always uses ``fullmatch`` with them.
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
"""Environment and Machine names: lowercase letters, digits and inner dashes, 1..40 characters."""
PROJECT_ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
"""A project id: lowercase letters, digits, '.', '_' and '-', 1..64 characters, alphanumeric at both ends."""
ENV_ID_RE = re.compile(rf"^env_[{_ALPHABET}]{{{_ID_LEN}}}$")
MACHINE_ID_RE = re.compile(rf"^mch_[{_ALPHABET}]{{{_ID_LEN}}}$")


def _random(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(_ID_LEN))


def new_env_id() -> str:
    """A fresh Environment id, e.g. ``env_7k3m9q2x4t1z``."""
    return _random("env_")


def new_machine_id() -> str:
    """A fresh Machine id, e.g. ``mch_0d5r8w2n6c3b``."""
    return _random("mch_")


def new_operation_id() -> str:
    """A fresh operation record id, e.g. ``op_…``."""
    return _random("op_")


def looks_like_env_id(value: str) -> bool:
    return ENV_ID_RE.fullmatch(value) is not None


def looks_like_machine_id(value: str) -> bool:
    return MACHINE_ID_RE.fullmatch(value) is not None


def workspace_id(project_id: str, env_id: str, machine_id: str) -> str:
    """The Runtime Protocol ``workspace_id`` of a Machine: stable, unique, derived only from immutable ids."""
    return f"vz-{project_id}-{env_id}-{machine_id}"
