"""The renderer's sandbox reads a message's fields, a string's methods and the loop's attributes the short way, and
renders exactly what jinja2's own immutable sandbox renders: the same values, the same undefined fields, dict's
own attributes before keys of the same name, and the same refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from corpus_builder.tokens import TemplateRenderer
from corpus_builder.tokens.template import _sandbox

FIELDS = ("{% for m in messages %}{{ m.role }}:{{ m.content }}|{{ m.missing is defined }}|"
          "{{ m.reasoning_content if m.reasoning_content is string else '-' }}|{{ m.items is callable }}|"
          "{{ m.get('content') }}|{{ m['role'] }}|{{ (' ' + m.role + ' ').strip() }}|{{ loop.index0 }}|"
          "{{ loop.missing is defined }}|{{ m.role.missing is defined }}|{{ '{0}-{1}'.format(m.role, loop.last) }}"
          "\n{% endfor %}")
MESSAGES = [{"role": "user", "content": "hi", "items": "a key named like a dict method"},
            {"role": "assistant", "content": "", "reasoning_content": "why"}]


def test_renders_as_jinja2s_sandbox() -> None:
    ours = _sandbox()().from_string(FIELDS).render(messages=MESSAGES)
    assert ours == ImmutableSandboxedEnvironment().from_string(FIELDS).render(messages=MESSAGES)
    assert ours.splitlines() == ["user:hi|False|-|True|hi|user|user|0|False|False|user-False",
                                 "assistant:|False|why|True||assistant|assistant|1|False|False|assistant-True"]


@pytest.mark.parametrize("template", [
    "{{ messages[0].__class__.__mro__ }}", "{{ messages[0].update({'a': 1}) }}",
    "{{ messages[0].role.__class__.__mro__ }}", "{% for m in messages %}{{ loop.__class__.__mro__ }}{% endfor %}",
    "{{ '{0.__class__.__mro__}'.format(messages[0].role) }}"])
def test_refuses_what_jinja2s_sandbox_refuses(template: str) -> None:
    with pytest.raises(SecurityError):
        _sandbox()().from_string(template).render(messages=MESSAGES)
    with pytest.raises(SecurityError):
        ImmutableSandboxedEnvironment().from_string(template).render(messages=MESSAGES)


def test_the_renderer_uses_it(tiny_model_dir: Path) -> None:
    assert isinstance(TemplateRenderer(tiny_model_dir)._template.environment, _sandbox())
