"""A real `nmt serve` process for the tests: start it on a free loopback port, talk to it, stop it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_server(run: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """`nmt serve --port 0` in a subprocess; returns it and its port once /health answers."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "nmt", "serve", "--run", str(run), "--port", "0", "--precision", "fp32", *args]
    proc = subprocess.Popen(  # its own process group, as a terminal's foreground job: see `interrupt`
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    line, startup = "", []
    while "http://127.0.0.1:" not in line and proc.poll() is None:  # after the model's loading messages
        line = proc.stdout.readline()
        startup.append(line)
    proc.startup = "".join(startup)  # what it printed before it answered
    if "http://127.0.0.1:" not in line:
        proc.kill()
        raise AssertionError(f"server did not start: {line}{proc.stdout.read()}")
    port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
    for _ in range(200):
        try:
            if request(port, "GET", "/health")[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("server never became healthy")


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, parent pid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(entry.name)[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue  # ended meanwhile
    return found


def alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C in a terminal: SIGINT to the server's whole process group, its children included."""
    os.killpg(proc.pid, signal.SIGINT)


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return out


def fail_on(translator: object, word: str, monkeypatch: object) -> None:
    """Make `translator.translate_nbest` raise RuntimeError("model exploded") for a batch holding
    `word`, and decode every other batch as before (a model failure confined to some requests)."""
    original = translator.translate_nbest

    def fragile(lines, *args, **kwargs):
        if any(word in line for line in lines):
            raise RuntimeError("model exploded")
        return original(lines, *args, **kwargs)

    monkeypatch.setattr(translator, "translate_nbest", fragile)
