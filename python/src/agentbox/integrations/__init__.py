"""agentbox as the sandbox backend of agent frameworks.

- :mod:`agentbox.integrations.openai_agents` — ``AgentboxSandboxClient`` for the openai-agents
  sandbox runtime (``pip install 'agentbox[openai-agents]'``);
- :mod:`agentbox.integrations.agentscope` — ``AgentboxWorkspace``, ``AgentboxBackend`` and
  ``AgentboxWorkspaceManager`` for agentscope (``pip install 'agentbox[agentscope]'``).

Each module imports its framework; this package imports neither.
"""
