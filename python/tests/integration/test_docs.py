"""Every Python block of the repository's README.md, docs/ and python/README.md runs as a
program against this module's namespace (the kubeconfig context's namespace, as the blocks
say), in document order. A block marked ``<!-- excerpt of PATH -->`` is an excerpt of an
example that ``test_examples.py`` runs instead (tests/readme.rs checks that it is one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from .conftest import REPO, Env


def documents() -> list[Path]:
    """The documents in the order tests/readme.rs runs their blocks."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "python/README.md"]


def python_blocks() -> list[tuple[str, str]]:
    """(``doc:line``, code) of every Python block that is not an excerpt."""
    out = []
    for doc in documents():
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = lines[i].strip()
            if not fence.startswith("```"):
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            above = next((x.strip() for x in reversed(lines[:i]) if x.strip()), "")
            excerpt = above.startswith("<!-- excerpt of ")
            if fence[3:].split()[:1] == ["python"] and not excerpt:
                name = f"{doc.relative_to(REPO)}:{i + 2}"
                out.append((name, "\n".join(lines[i + 1 : end]) + "\n"))
            i = end + 1
    return out


def kubeconfig_of(ns: str, path: Path) -> None:
    """A copy of $KUBECONFIG whose current context's namespace is ``ns``."""
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    current = config["current-context"]
    for ctx in config["contexts"]:
        if ctx["name"] == current:
            ctx["context"]["namespace"] = ns
    path.write_text(yaml.safe_dump(config))


def test_every_python_block_of_the_docs_runs(env: Env, tmp_dir: Path) -> None:
    blocks = python_blocks()
    names = [name for name, _ in blocks]
    assert any(n.startswith("README.md:") for n in names), names
    assert sum(n.startswith("python/README.md:") for n in names) >= 2, names
    kubeconfig = tmp_dir / "kubeconfig"
    kubeconfig_of(env.ns, kubeconfig)
    run_env = {k: v for k, v in os.environ.items() if k != "AGENTBOX_NAMESPACE"}
    run_env["KUBECONFIG"] = str(kubeconfig)
    printed = {}
    for name, code in blocks:
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=run_env,
            cwd=tmp_dir,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert out.returncode == 0, f"{name}:\n{code}\n{out.stdout}\n{out.stderr}\n{env.logs()}"
        printed[name] = out.stdout
    # What the README's block says it does: it reads back the note it wrote.
    (readme,) = (text for name, text in printed.items() if name.startswith("README.md:"))
    assert "ship it" in readme, readme
