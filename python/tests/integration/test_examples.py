"""examples/python/quickstart.py runs as a harness author would run it."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import REPO, Env


def test_quickstart_runs(env: Env) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python" / "quickstart.py")],
        env={**os.environ, "AGENTBOX_NAMESPACE": env.ns},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{env.logs()}"
    text = out.stdout
    assert "exit code 3: hello from agentbox" in text
    assert "timed out as asked (exit code 137)" in text
    assert "refused before any request" in text
    assert "turn done under fencing token" in text and "'step', '2'" in text
    assert "restored: ship it" in text


def test_the_readme_python_example_runs(env: Env) -> None:
    # The README's Python section's first code block, against this module's namespace.
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("\n## Python\n") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert 'agentbox.Sandboxes("agents")' in code
    code = code.replace('agentbox.Sandboxes("agents")', f'agentbox.Sandboxes("{env.ns}")')
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{env.logs()}"
    assert "ship it" in out.stdout
