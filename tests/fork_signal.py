"""Run a snippet in a fresh Python whose SIGTERM arrives while it forks (tests of signal races, tier 3).

The prelude raises ``Terminated`` from the SIGTERM handler, as ``cli._on_sigterm`` raises SystemExit, and sends the
process SIGTERM from an at-fork hook in the parent: the moment CI once lost a signal in. The process exits 143 when
``Terminated`` reaches the top, 0 when the snippet ends without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_PRELUDE = """\
import os, signal, sys

class Terminated(BaseException):
    pass

def on_sigterm(signum, frame):
    raise Terminated

signal.signal(signal.SIGTERM, on_sigterm)
os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGTERM))
try:
{body}
except Terminated:
    sys.exit(143)
sys.exit(0)
"""


def run_with_sigterm_at_fork(body: str, *args: str, env: dict | None = None,
                             timeout: float = 120) -> subprocess.CompletedProcess:
    script = _PRELUDE.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "))
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **(env or {}))
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, env=full_env,
                          timeout=timeout)
