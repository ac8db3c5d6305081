"""Errors of the AI layer, below `KnechtError` (see mcp_knecht/errors.py):

    KnechtError
    └── FeatureError                 "ai_failed"       a feature run could not give an answer
        ├── FeatureUnavailable       "ai_unavailable"  no model configured for the role, or no key for
        │                                              its provider: the message names the variable to set
        ├── ModelCallError           "ai_model"        the provider failed, refused or timed out
        └── FeatureOutputError       "ai_output"       the answer did not fit the output model, even after
                                                       one repair attempt

Provider and SDK exceptions are translated where the loop calls the model (`raise … from exc`).
"""

from __future__ import annotations

from mcp_knecht.errors import KnechtError


class FeatureError(KnechtError):
    code = "ai_failed"


class FeatureUnavailable(FeatureError):
    code = "ai_unavailable"


class ModelCallError(FeatureError):
    code = "ai_model"


class FeatureOutputError(FeatureError):
    code = "ai_output"
