"""What a process can reach of the server, tried from wherever it runs; standard library only.

    python reach_probe.py [--out FILE] [--tcp NAME=PORT]... [--unix NAME=PATH]...
                          [--mint NAME=THREADLOOM=DATABASE_URL] [-- ARGV...]

It prints one line (to stderr when ARGV follows: that command's stdout may be a protocol) and writes it to
FILE: `NAME=open` or `NAME=shut` for a TCP connect to 127.0.0.1:PORT or a connect to the unix socket PATH,
`NAME=minted` or `NAME=refused` for `THREADLOOM token create --scope admin --name NAME` run with
DATABASE_URL. A PATH or DATABASE_URL written `@FILE` is read from FILE (they are known only once the server
runs). With ARGV it then becomes that command (exec), so an agent's command line can be prefixed with it:
the probe runs as the agent process itself would, as its user and in its namespaces.

The tests run it three ways: copied into a workspace as a scripted agent's command (inside its sandbox), as
the prefix of an `acp` instance's command (the agent process itself), and by the test on the host (the twin).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def connect(family: socket.AddressFamily, address: object) -> str:
    try:
        with socket.socket(family) as sock:
            sock.settimeout(10)
            sock.connect(address)
        return "open"
    except OSError:
        return "shut"


def mint(threadloom: str, database_url: str, name: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "DATABASE_URL": database_url}
    try:
        done = subprocess.run(
            [threadloom, "token", "create", "--scope", "admin", "--name", name],
            env=env, capture_output=True, text=True, timeout=60, cwd="/",
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "refused"
    return "minted" if done.returncode == 0 and "tl_" in done.stdout else "refused"


def given(value: str) -> str:
    if not value.startswith("@"):
        return value
    with open(value[1:]) as file:
        return file.read().strip()


def main(argv: list[str]) -> None:
    then: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, then = argv[:at], argv[at + 1 :]
    out = None
    found: list[str] = []
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        if flag == "--out":
            out = value
            continue
        name, target = value.split("=", 1)
        if flag == "--tcp":
            found.append(f"{name}={connect(socket.AF_INET, ('127.0.0.1', int(target)))}")
        elif flag == "--unix":
            found.append(f"{name}={connect(socket.AF_UNIX, given(target))}")
        elif flag == "--mint":
            program, url = target.split("=", 1)
            found.append(f"{name}={mint(program, given(url), name)}")
        else:
            raise SystemExit(f"unknown option {flag}")
    line = " ".join(found)
    print(line, file=sys.stderr if then else sys.stdout, flush=True)
    if out is not None:
        with open(out, "w") as file:
            file.write(line + "\n")
    if then:
        os.execv(then[0], then)


if __name__ == "__main__":
    main(sys.argv[1:])
