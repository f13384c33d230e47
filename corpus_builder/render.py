"""Render conversations with the target's own chat template and count them in its tokens.

The template is rendered with jinja2 the way transformers' ``apply_chat_template`` does (sandboxed,
trim_blocks/lstrip_blocks, ``tojson``, ``raise_exception``) and tokenized with the fast ``tokenizers``
library and ``add_special_tokens=False`` (the template already emits the BOS), so budgets are measured
without importing transformers or torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from .errors import CorpusError
from .records import Conversation


def _raise_exception(message: str) -> None:
    raise CorpusError(f"chat template raised: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def load_chat_template(tokenizer_dir: Path) -> tuple[str, dict[str, Any]]:
    """The template text and tokenizer_config.json (for bos/eos names)."""
    config_path = tokenizer_dir / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CorpusError(f"not valid JSON: {error}", file=str(config_path)) from None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = tokenizer_dir / "chat_template.jinja"
    if template is None and jinja_file.exists():
        template = jinja_file.read_text(encoding="utf-8")
    if not template:
        raise CorpusError("no chat template (tokenizer_config.json chat_template or chat_template.jinja)",
                          file=str(tokenizer_dir))
    return template, config


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as a dict
        return value.get("content")
    return value


class TemplateRenderer:
    """Renders and counts conversations as the target sees them at serve time."""

    def __init__(self, tokenizer_dir: Path, *, enable_thinking: bool = True,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.enable_thinking = enable_thinking
        self.template_kwargs = template_kwargs or {}
        template_text, config = load_chat_template(tokenizer_dir)
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=[loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = environment.from_string(template_text)
        self._special = {"bos_token": _token_text(config.get("bos_token")) or "",
                         "eos_token": _token_text(config.get("eos_token")) or ""}

    @cached_property
    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        path = self.tokenizer_dir / "tokenizer.json"
        if not path.exists():
            raise CorpusError("tokenizer.json not found", file=str(self.tokenizer_dir))
        return Tokenizer.from_file(str(path))

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     enable_thinking=self.enable_thinking, **self._special,
                                     **self.template_kwargs)

    def render_conversation(self, conversation: Conversation) -> str:
        messages = []
        for m in conversation.messages:
            message: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.role == "assistant" and m.reasoning is not None:
                message["reasoning_content"] = m.reasoning
            messages.append(message)
        return self.render(messages)

    def count_tokens(self, conversations: Sequence[Conversation]) -> list[int]:
        texts = [self.render_conversation(c) for c in conversations]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encodings]
