"""AI features in the server (seed 002): features run by a model through the same gate as MCP clients.

    settings.py   model roles, providers, keys: every variable of the AI layer, read in one place
    models.py     role → pydantic-ai model on the provider's SDK (anthropic, openai, google, langdock,
                  openai-compatible); unavailable with the variable to set when something is missing
    feature.py    `Feature` (id, role, instructions, tool allowlist, output model, max_steps), results
    loop.py       `run_feature`: the agentic loop; every tool call through `Gate.call_tool`
    runtime.py    `AiRuntime`: the loop over a server's gate, usage recorded per run, background work
    diagnosis.py  the failure diagnosis feature and its service; diagnoses.py its storage and claims
    worker.py     the background diagnosis of failed runs
    workflow_fix.py  a feature that writes: a corrected workflow, staged as a proposal

Importing this package imports no provider SDK and not pydantic-ai: they load when a feature runs.
"""
