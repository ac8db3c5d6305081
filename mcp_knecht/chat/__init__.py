"""The chat (seed 000's endpoint, with seed 004's follow-up): a person talks to an assistant over the
data this server serves, through the same gate as every MCP client.

    service.py     ChatService: owned conversations, a turn per message, the follow-up after a decision
    turn.py        one turn: the model, read tools through the gate, one proposal at most, 5 rounds
    actions.py     the page a turn that staged a proposal opens (seed 000's frontend action)
    followups.py   the worker that delivers each follow-up exactly once, across replicas and restarts
    store.py       conversations, messages and follow-ups in the store (namespace `chat`)
    texts.py       the system prompt, the fixed replies, the follow-up messages

The HTTP routes are `mcp_knecht.transports.chat_api`.
"""

from mcp_knecht.chat.service import CHAT_SCOPE, ChatReply, ChatService

__all__ = ["CHAT_SCOPE", "ChatReply", "ChatService"]
