"""The public surface of vz_core.env: curated, complete, and cheap to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vz_core.env as env


def test_every_exported_name_resolves() -> None:
    for name in env.__all__:
        assert getattr(env, name) is not None
    assert set(dir(env)) == set(env.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        env.nope  # noqa: B018


def test_importing_the_package_and_the_exec_path_loads_no_pydantic() -> None:
    code = (
        "import sys, vz_core.env\n"
        "from vz_core.env import Store, prepare_exec, select_environment, acquire_driver\n"
        "print('pydantic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "False\n"
