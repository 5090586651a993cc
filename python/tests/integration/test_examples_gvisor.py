"""Both framework examples of examples/python under gVisor (issue 31): the module's operator
runs every sandbox under the RuntimeClass ``gvisor`` (``--default-runtime-class``), and its
namespace requires that class (``agentbox.dev/required-runtime-class``), so a sandbox that ran
under another runtime would be refused and the example would fail."""

from __future__ import annotations

from .conftest import Env
from .test_examples import check_the_agentscope_example, check_the_openai_agents_example

OPERATOR_ARGS = ("--default-runtime-class", "gvisor")
NAMESPACE_ANNOTATIONS = {"agentbox.dev/required-runtime-class": "gvisor"}


async def test_the_openai_agents_example_runs_under_gvisor(env: Env) -> None:
    await check_the_openai_agents_example(env)


async def test_the_agentscope_example_runs_under_gvisor(env: Env) -> None:
    check_the_agentscope_example(env)
