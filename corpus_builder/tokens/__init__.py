"""The target's tokens: its chat template rendered as at serve time, its tokenizer, and token-exact rows.

``template`` renders conversations the way the target sees them (jinja2 + ``tokenizers``, no torch),
``twin`` counts with an exact tiktoken twin where one exists, ``measure`` measures every assistant turn of a
batch at one encode per view and checks generated turns against their served ids (the build's statistics and
the audit's meter use it), ``rows`` cuts one training row per assistant turn out of that measurement,
``settings`` says which tokenizer and template options a recipe or a built corpus uses. A build loads the
renderer once and shares it.
"""

from .measure import Measurement, TokenFacts, TokenMismatch, TurnTokens, common_prefix, served_turns
from .rows import ConversationTokens, TokenRows, TurnRow
from .settings import TokenSettings
from .template import TemplateRenderer, TemplateWithoutTools
from .twin import NoTwin, twin_of

__all__ = ["ConversationTokens", "Measurement", "NoTwin", "TemplateRenderer", "TemplateWithoutTools", "TokenFacts",
           "TokenMismatch", "TokenRows", "TokenSettings", "TurnRow", "TurnTokens", "common_prefix", "served_turns",
           "twin_of"]
