"""deploy/ray/README.md's "Try it on one machine", run as written, so the recipe cannot drift.

The commands are read from the README's bash blocks and run in order from the repository root,
each as the README writes it, with the only changes a shared machine needs:
- the ports the recipe names (the GCS's 6380, gRPC 50051, HTTP 8000) are free ones of the test's,
  and `ray start` also gets free ports for what Ray would open at fixed defaults;
- a shell variable the recipe sets (`NODE_IP=...`) is set again before each later command, as in
  the reader's terminal;
- HOME (so `~/.ray/auth_token`) and RAY_TMPDIR are the test's own (tests/ray_head.py);
- `pdserve up` runs in the background until the README's Ctrl-C (SIGINT);
- `ray stop` stops every Ray on the machine: the test stops only the processes of its head.
A command the test does not know fails it: teach it here rather than skip the README's new step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ray_head import (REPO, free_ray_port, isolating_flags, private_dir, ray_env, session_processes, start_head,
                      stop_session)

pytestmark = pytest.mark.integration
pytest.importorskip("ray")

README = REPO / "deploy" / "ray" / "README.md"
SECTION = "## Try it on one machine"
RECIPE_PORTS = ("6380", "50051", "8000")   # GCS, router gRPC, router HTTP
UP_TIMEOUT_S = 900.0                        # engines start in ~20 s on an idle machine; this one is shared
COMMAND_TIMEOUT_S = 300.0
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def readme_commands(text: str) -> list[str]:
    """The command lines of the section's bash blocks, continuation lines joined, comments kept
    (bash ignores them)."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def with_ports(command: str, ports: dict[str, int]) -> str:
    return re.sub(r"\b(" + "|".join(ports) + r")\b", lambda match: str(ports[match.group(1)]), command)


def run(command: str, env: dict[str, str], context: Path | None = None) -> str:
    """The command's output; on failure, its output and the end of `context` (a log) fail the test."""
    result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S)
    assert result.returncode == 0, (f"`{command}` exited with {result.returncode}:\n{result.stdout}{result.stderr}"
                                    + (f"\n{context}:\n{context.read_text()[-3000:]}" if context else ""))
    return result.stdout


def test_commands_are_what_this_test_knows_how_to_run():
    commands = readme_commands(README.read_text())
    assert [ASSIGNMENT.match(command).group(0) if ASSIGNMENT.match(command) else " ".join(command.split()[:2])
            for command in commands] == [
        "make env", ".venv/bin/pdserve make-model", ".venv/bin/ray get-auth-token", ".venv/bin/ray start",
        ".venv/bin/pdserve up", "NODE_IP=", "curl http://$NODE_IP:8000/v1/completions", ".venv/bin/ray stop"]
    for port in RECIPE_PORTS:
        assert any(re.search(rf"\b{port}\b", command) for command in commands), f"the recipe no longer names port {port}"


def test_the_one_machine_recipe_serves_a_completion_with_token_authentication_on(tiny_model):
    commands = readme_commands(README.read_text())
    ports = {port: free_ray_port() for port in RECIPE_PORTS}
    folder = private_dir("pdreadme-")
    (folder / "home").mkdir()
    env = ray_env(folder / "home", folder)
    head, up, variables = None, None, []
    try:
        for line in (with_ports(command, ports) for command in commands):
            shell = "; ".join([*variables, line])   # the reader's terminal keeps the variables set before
            if ASSIGNMENT.match(line):
                run(shell, env)
                variables.append(line)
            elif line.startswith("make env"):
                assert subprocess.run(["make", "-q", "env"], cwd=REPO).returncode == 0, \
                    "the venv is older than its lock file: `make env` would reinstall it; run it first"
                run(shell, env)
            elif line.startswith((".venv/bin/pdserve make-model", ".venv/bin/ray get-auth-token")):
                run(shell, env)
            elif line.startswith(".venv/bin/ray start"):
                isolated = shell.replace("ray start", f"ray start {' '.join(isolating_flags())}", 1)  # before a comment
                head = start_head(isolated, env, folder / "ray-start.log")
                assert "Token authentication is enabled for this Ray cluster" in (folder / "ray-start.log").read_text()
            elif line.startswith(".venv/bin/pdserve up"):
                up = _start_up(shell, env, folder / "up.log")
            elif line.startswith("curl"):
                completion = json.loads(run(shell, env, folder / "up.log"))
                assert isinstance(completion["choices"][0]["text"], str)
                assert 0 < completion["usage"]["completion_tokens"] <= 16
            elif line.startswith(".venv/bin/ray stop"):
                os.killpg(up.pid, signal.SIGINT)          # the README's Ctrl-C on `pdserve up`
                assert up.wait(timeout=120) == 0, (folder / "up.log").read_text()[-3000:]
                assert stop_session(head) == set(), "Ray processes had to be killed"
                assert session_processes(head) == {}
            else:
                pytest.fail(f"the README runs `{line}`, which this test does not know how to run")
        # the members are at the node address Ray gave (`ray start`'s "Local node IP"), as the README says
        node_ip = re.search(r"Local node IP: (\S+)", (folder / "ray-start.log").read_text()).group(1)
        assert run("; ".join([*variables, "echo $NODE_IP"]), env).strip() == node_ip
        output = (folder / "up.log").read_text()
        assert f"gRPC   {node_ip}:{ports['50051']}" in output and f"http://{node_ip}:{ports['8000']}" in output
        assert "Failed to connect" not in output and "InvalidAuthToken" not in output
    finally:
        if up is not None and up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        if head is not None:
            stop_session(head)
        shutil.rmtree(folder, ignore_errors=True)


def _start_up(command: str, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """`pdserve up` in the background, once it prints that it is up."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(["bash", "-c", command], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + UP_TIMEOUT_S
    while "Ctrl-C to stop" not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"`{command}` did not come up (exit code {process.poll()}):\n{log_path.read_text()[-3000:]}")
        time.sleep(1.0)
    return process
