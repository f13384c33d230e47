"""The target's tokens: its chat template rendered as at serve time, its tokenizer, and token-exact rows.

``template`` renders conversations the way the target sees them (jinja2 + ``tokenizers``, no torch),
``twin`` counts with an exact tiktoken twin where one exists, ``rows`` builds one training row per
assistant turn and checks generated turns against their served ids, ``settings`` says which tokenizer and
template options a recipe or a built corpus uses. A build loads the renderer once and shares it.
"""

from .rows import ConversationTokens, TokenMismatch, TokenRows, TurnRow, common_prefix, served_turns
from .settings import TokenSettings
from .template import TemplateRenderer, TemplateWithoutTools
from .twin import NoTwin, twin_of

__all__ = ["ConversationTokens", "NoTwin", "TemplateRenderer", "TemplateWithoutTools", "TokenMismatch", "TokenRows",
           "TokenSettings", "TurnRow", "common_prefix", "served_turns", "twin_of"]
