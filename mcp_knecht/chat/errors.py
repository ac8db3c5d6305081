"""Errors of the chat, below `KnechtError` (see mcp_knecht/errors.py), beside the AI layer's:

    KnechtError
    ├── FeatureError                  (mcp_knecht.ai.errors: unavailable 503, the model failed 500)
    └── ChatError                     "chat"
        ├── ConversationNotFound      "not_found"         unknown, or another subject's (404, the same)
        └── RoundLimitError           "chat_round_limit"  the model wanted more than 5 rounds of tools
"""

from __future__ import annotations

from mcp_knecht.errors import KnechtError


class ChatError(KnechtError):
    code = "chat"


class ConversationNotFound(ChatError):
    code = "not_found"


class RoundLimitError(ChatError):
    code = "chat_round_limit"
