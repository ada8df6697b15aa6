"""Docker contexts written into the CLI's store, read back by the real docker CLI (DOCKER_CONFIG in a temp dir):
the CLI lists and inspects them, the current context and config.json are never touched, someone else's context
of the same name is refused, and removal leaves no trace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vz_core.docker_context import context_id, context_name, read_context, remove_context, write_context
from vz_core.errors import FailedPreconditionError, InvalidArgumentError

DOCKER = shutil.which("docker")
needs_cli = pytest.mark.skipif(DOCKER is None, reason="needs the docker CLI")


def cli(config: Path, *args: str) -> str:
    assert DOCKER is not None
    env = {"PATH": os.environ.get("PATH", ""), "DOCKER_CONFIG": str(config), "HOME": str(config.parent)}
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_context_names_follow_the_cli_rule() -> None:
    assert context_name("default", "dev") == "vz-default-dev"
    with pytest.raises(InvalidArgumentError, match="cannot be a Docker context name"):
        context_name("a b", "dev")


@needs_cli
def test_the_docker_cli_reads_the_context_and_the_default_stays(tmp_path: Path) -> None:
    config = tmp_path / "docker"
    environ = {"DOCKER_CONFIG": str(config)}
    socket = tmp_path / "state" / "docker.sock"
    write_context("vz-default-dev", socket, "vz Machine dev of Environment default", environ)
    meta = config / "contexts" / "meta" / context_id("vz-default-dev") / "meta.json"
    assert oct(meta.stat().st_mode & 0o777) == "0o644"

    listed = [json.loads(line) for line in cli(config, "context", "ls", "--format", "{{json .}}").splitlines()]
    by_name = {c["Name"]: c for c in listed}
    assert by_name["vz-default-dev"]["DockerEndpoint"] == f"unix://{socket}"
    assert by_name["default"]["Current"] is True and by_name["vz-default-dev"]["Current"] is False
    inspected = json.loads(cli(config, "context", "inspect", "vz-default-dev"))[0]
    assert inspected["Endpoints"]["docker"]["Host"] == f"unix://{socket}"
    assert inspected["Metadata"]["Description"] == "vz Machine dev of Environment default"
    assert not (config / "config.json").exists()
    assert read_context("vz-default-dev", environ) is not None

    assert remove_context("vz-default-dev", environ)
    names = {json.loads(line)["Name"] for line in cli(config, "context", "ls", "--format", "{{json .}}").splitlines()}
    assert names == {"default"}
    assert list((config / "contexts" / "meta").iterdir()) == []


@needs_cli
def test_a_context_vz_did_not_write_is_neither_replaced_nor_removed(tmp_path: Path) -> None:
    config = tmp_path / "docker"
    environ = {"DOCKER_CONFIG": str(config)}
    cli(config, "context", "create", "vz-default-dev", "--docker", "host=unix:///run/someone-else.sock")
    meta = config / "contexts" / "meta" / context_id("vz-default-dev") / "meta.json"
    before = meta.read_bytes()
    with pytest.raises(FailedPreconditionError, match="was not created by vz"):
        write_context("vz-default-dev", tmp_path / "s.sock", "x", environ)
    assert not remove_context("vz-default-dev", environ)
    assert read_context("vz-default-dev", environ) is None
    assert meta.read_bytes() == before
