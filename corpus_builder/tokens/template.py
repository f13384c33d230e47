"""Render conversations with the target's own chat template and count them in its tokens.

The template is rendered with jinja2 the way transformers' ``apply_chat_template`` does (sandboxed,
trim_blocks/lstrip_blocks, ``tojson``, ``raise_exception``) and tokenized with the fast ``tokenizers``
library and ``add_special_tokens=False`` (the template already emits the BOS), so budgets are measured
without importing transformers or torch. Counts come from an exact tiktoken twin of the tokenizer where one
exists (``tokens.twin``; several times faster); ``CORPUS_TOKEN_COUNTER=tokenizers`` turns it off.

Tool traffic renders through the template's own tool handling, as vLLM renders a request: the row's tools as
the ``tools`` argument, assistant turns' ``tool_calls`` with their arguments decoded to an object (vLLM's rule:
arguments that are not a JSON object render as ``{}``), tool turns as they are. A template that cannot render
them (it raises on a tool turn, or leaves the tools, a call or a result out) is refused with
``TemplateWithoutTools`` naming the source, never rendered without them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from functools import cache, cached_property
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import CorpusError
from ..records import Conversation, openai_messages

if TYPE_CHECKING:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tiktoken import Encoding
    from tokenizers import Tokenizer

ENCODE_CHUNK = 256  # conversations rendered while the previous chunk is being tokenized
TWIN_THREADS = min(8, os.cpu_count() or 1)  # tiktoken releases the GIL

T = TypeVar("T")


# A conversation with one tool, one call and its result, each named so its render shows whether the template
# wrote it out.
_PROBE_TOOLS: list[dict[str, object]] = [{"type": "function", "function": {
    "name": "corpus_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}]
_PROBE: list[dict[str, object]] = [
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
        "name": "corpus_probe_call", "arguments": {"corpus_probe_argument": 1}}}]},
    {"role": "tool", "content": "corpus_probe_result", "tool_call_id": "call_0"},
]
_PROBE_MARKS = {"corpus_probe_tool": "the tools", "corpus_probe_call": "the call's name",
                "corpus_probe_argument": "the call's arguments", "corpus_probe_result": "the tool's result"}
_THINK_TAGS = ("<think>", "</think>")


class TemplateWithoutTools(CorpusError):
    """The target's chat template cannot render tool traffic that a source's rows carry."""


def _raise_exception(message: str) -> None:
    raise CorpusError(f"chat template raised: {message}")


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def load_chat_template(tokenizer_dir: Path) -> tuple[str, dict[str, object]]:
    """The template text and tokenizer_config.json (for bos/eos names)."""
    config_path = tokenizer_dir / "tokenizer_config.json"
    config: dict[str, object] = {}
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CorpusError(f"not valid JSON: {error}", file=str(config_path)) from None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    jinja_file = tokenizer_dir / "chat_template.jinja"
    if template is None and jinja_file.exists():
        template = jinja_file.read_text(encoding="utf-8")
    if not template or not isinstance(template, str):
        raise CorpusError("no chat template (tokenizer_config.json chat_template or chat_template.jinja)",
                          file=str(tokenizer_dir))
    return template, config


_DICT_ATTRIBUTES = frozenset(dir(dict))
_STR_FORMATTERS = ("format", "format_map")  # the sandbox wraps these


@cache
def _sandbox() -> type[ImmutableSandboxedEnvironment]:
    """jinja2's immutable sandbox (as transformers renders chat templates), with short ways to what templates
    read most, each giving what the sandbox gives:

    * a message's fields: ``message.role`` on a dict is ``getattr`` first, which fails (a dict has only dict's
      attributes), then the key (the sandbox checks attributes, never keys). For a name that is not one of
      dict's attributes the key is taken at once, without raising and catching an AttributeError per field;
    * a string's methods and the loop's attributes (``content.strip``, ``loop.index0``): for a ``str`` or a
      ``LoopContext`` the sandbox's verdict depends on the name alone (neither is a mutable container nor one
      of the types with internal attributes: only names starting with ``_`` are refused), so such names are
      taken at once; ``str.format`` keeps the sandbox's wrapper.

    Together half of a render's time. Imported on first use: jinja2 is not loaded by commands that
    render nothing."""
    from jinja2.runtime import LoopContext, Undefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    plain = (str, LoopContext)

    class KeyFirstSandbox(ImmutableSandboxedEnvironment):
        def getattr(self, obj: Any, attribute: str) -> Any | Undefined:
            kind = type(obj)
            if kind is dict and attribute not in _DICT_ATTRIBUTES:
                return obj[attribute] if attribute in obj else self.undefined(obj=obj, name=attribute)
            if kind in plain and not attribute.startswith("_") and attribute not in _STR_FORMATTERS:
                try:
                    return getattr(obj, attribute)
                except AttributeError:  # the sandbox's own way to an undefined value
                    pass
            return super().getattr(obj, attribute)

    return KeyFirstSandbox


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as a dict
        value = value.get("content")
    return value if isinstance(value, str) else None


def _renderer(tokenizer_dir: Path, enable_thinking: bool, history_reasoning: str,
              template_kwargs: dict[str, object]) -> TemplateRenderer:
    return TemplateRenderer(tokenizer_dir, enable_thinking=enable_thinking, history_reasoning=history_reasoning,
                            template_kwargs=template_kwargs)


class TemplateRenderer:
    """Renders and counts conversations as the target sees them at serve time.

    The served view of assistant turn ``j`` is its prompt (turns before ``j`` plus the generation prompt)
    followed by the turn itself. With ``history_reasoning="drop"`` the generator sent earlier exchanges'
    assistant turns back without their reasoning (the tool-calling steps after the last user turn keep
    theirs), so every view drops it likewise; this is done on the messages, not through a template flag, so
    it holds for any template.
    Where a conversation has no system turn the template adds its default one, as the server did.
    """

    def __init__(self, tokenizer_dir: Path, *, enable_thinking: bool = True, history_reasoning: str = "keep",
                 template_kwargs: dict[str, object] | None = None) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.enable_thinking = enable_thinking
        self.history_reasoning = history_reasoning
        self.template_kwargs = template_kwargs or {}
        self.template_text, config = load_chat_template(tokenizer_dir)
        from jinja2.ext import loopcontrols

        environment = _sandbox()(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = environment.from_string(self.template_text)
        # The template's globals as one dict, made once: jinja's ``Template.render`` copies them out of a ChainMap
        # twice a call, a quarter of a short render's time.
        self._globals = dict(self._template.globals)
        self._twin_checked = False
        self._pools: dict[tuple[int, str], ThreadPoolExecutor] = {}  # by process and name (``_threads``)
        self.twin_refusal: str | None = None  # why counts do not use the tiktoken twin, once it is chosen
        self._special = {"bos_token": _token_text(config.get("bos_token")) or "",
                         "eos_token": _token_text(config.get("eos_token")) or ""}

    def __reduce__(self) -> tuple[Callable[..., TemplateRenderer], tuple[Path, bool, str, dict[str, object]]]:
        """Pickled as its settings (a compiled template does not pickle): a task on a cluster makes its own from the
        same directory, named absolutely (a worker's working directory is not this process's)."""
        return (_renderer, (self.tokenizer_dir.absolute(), self.enable_thinking, self.history_reasoning,
                            self.template_kwargs))

    @cached_property
    def tokenizer(self) -> Tokenizer:
        from tokenizers import Tokenizer

        path = self.tokenizer_dir / "tokenizer.json"
        if not path.exists():
            raise CorpusError("tokenizer.json not found", file=str(self.tokenizer_dir))
        return Tokenizer.from_file(str(path))

    @property
    def eos_token(self) -> str:
        return self._special["eos_token"]

    def token_id(self, token: str) -> int | None:
        """The id of a token the tokenizer holds as one entry (e.g. ``</think>``), else None."""
        return self.tokenizer.token_to_id(token) if token else None

    def render(self, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = False,
               enable_thinking: bool | None = None, tools: Sequence[Mapping[str, object]] | None = None) -> str:
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        variables = dict(messages=list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                         enable_thinking=thinking, **self._special, **self.template_kwargs)
        # What ``Template.render`` does, with the globals copied once (``__init__``) instead of per call.
        template = self._template
        environment = template.environment
        context = environment.context_class(environment, {**self._globals, **variables}, template.name,
                                            template.blocks, globals=self._globals)
        try:
            return environment.concat(template.root_render_func(context))
        except Exception:
            environment.handle_exception()

    @cached_property
    def tool_support_problem(self) -> str | None:
        """Why the template cannot render tool traffic (it raises, or leaves something out), or None."""
        try:
            text = self.render(_PROBE, tools=_PROBE_TOOLS)
        except CorpusError as error:
            return f"rendering a tool call raised: {error.problem}"
        except Exception as error:  # a template that indexes or filters a tool call's fields it does not expect
            return f"rendering a tool call failed: {type(error).__name__}: {error}"
        missing = [what for mark, what in _PROBE_MARKS.items() if mark not in text]
        return f"its render leaves out {', '.join(missing)}" if missing else None

    @cached_property
    def thinking_mode_problem(self) -> str | None:
        """Why the template has no thinking mode, or None. A template has one when ``enable_thinking`` changes its
        generation prompt (a think block pre-opened, or closed empty when off), or when it names the think tags
        at all: a template that always thinks ignores the flag but writes the tags (to open the block, or to split
        earlier reasoning off)."""
        try:
            prompts = {self.render(_PROBE[:1], add_generation_prompt=True, enable_thinking=on) for on in (True, False)}
        except Exception:  # a template that cannot render a lone user turn fails where it renders rows, saying why
            return None
        if len(prompts) > 1 or any(tag in self.template_text for tag in _THINK_TAGS):
            return None
        return (f"its generation prompt is the same with enable_thinking true and false, and it writes no "
                f"{' or '.join(_THINK_TAGS)}")

    def template_input(self, conversation: Conversation, end: int, *, current: int
                       ) -> tuple[list[dict[str, object]], list[dict[str, Any]] | None]:
        """(``messages[:end]`` as the template receives them, the tools) for the view of turn ``current``: the
        messages the generator sent (``records.openai_messages``: history reasoning kept, or only the current
        exchange's when dropped), with tool-call arguments decoded as vLLM decodes them."""
        tools = conversation.tools
        if conversation.has_tool_traffic and self.tool_support_problem is not None:
            raise TemplateWithoutTools(
                f"source '{conversation.source}': its rows carry tool calls, but the chat template of "
                f"{self.tokenizer_dir} cannot render them ({self.tool_support_problem}); use the target's own "
                "tokenizer directory, whose template handles tools")
        turns = conversation.messages[:end]
        messages = openai_messages(turns, keep_history_reasoning=self.history_reasoning == "keep", current=current)
        for message, turn in zip(messages, turns, strict=True):
            if turn.tool_calls:  # (openai_messages writes the calls of assistant turns only) with the arguments
                # decoded, as vLLM decodes them (arguments that are not a JSON object render as {})
                message["tool_calls"] = [{**call.to_openai(), "function": {
                    "name": call.name, "arguments": call.arguments_object() or {}}} for call in turn.tool_calls]
        return messages, tools

    def render_prompt(self, conversation: Conversation, turn: int, *, enable_thinking: bool | None = None) -> str:
        """What the server rendered to generate assistant turn ``turn``: the turns before it + generation prompt."""
        messages, tools = self.template_input(conversation, turn, current=turn)
        return self.render(messages, add_generation_prompt=True, enable_thinking=enable_thinking, tools=tools)

    def extended_prompt(self, conversation: Conversation, turn: int, view: str) -> str | None:
        """The generation prompt of replayed turn ``turn`` that its rendered ``view`` extends, or None when it
        extends neither mode's. The renderer's thinking mode is tried first; a turn with reasoning under a
        thinking-off recipe (or the reverse) extends only the other mode's prompt: the mode it was made in."""
        for thinking in (self.enable_thinking, not self.enable_thinking):
            prompt = self.render_prompt(conversation, turn, enable_thinking=thinking)
            if view.startswith(prompt):
                return prompt
        return None

    def render_through(self, conversation: Conversation, turn: int) -> str:
        """The served view of assistant turn ``turn``: its prompt's turns followed by the turn itself."""
        messages, tools = self.template_input(conversation, turn + 1, current=turn)
        return self.render(messages, tools=tools)

    def budget_views(self, conversation: Conversation) -> list[str]:
        """The renders whose longest is the conversation's length as served: the whole conversation when
        history reasoning is kept (every turn's view is a prefix of it), else every assistant turn's view
        (a dropped reasoning makes a later view shorter than an earlier one)."""
        messages = conversation.messages
        turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
        views = [] if self.history_reasoning == "keep" else [self.render_through(conversation, i) for i in turns]
        if not views or turns[-1] != len(messages) - 1:  # the whole conversation: trailing non-assistant turns too
            whole, tools = self.template_input(conversation, len(messages), current=len(messages))
            views.append(self.render(whole, tools=tools))
        return views

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of rendered texts; the template emits its own BOS, so no special tokens are added."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    @property
    def _encoder(self) -> ThreadPoolExecutor:
        return self._threads("encode", 1)

    @property
    def _twin_threads(self) -> ThreadPoolExecutor:
        return self._threads("twin-encode", TWIN_THREADS)

    def _threads(self, name: str, count: int) -> ThreadPoolExecutor:
        """This process's pool ``name``: a pool made before a fork has no threads in the child (a build's forked
        readers reuse a renderer its process used before), and work sent to it would wait forever."""
        key = (os.getpid(), name)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ThreadPoolExecutor(max_workers=count, thread_name_prefix=name)
        return pool

    @cached_property
    def twin(self) -> Encoding | None:
        """The tiktoken twin used for counting, or None (then ``twin_refusal`` says why)."""
        from .twin import NoTwin, twin_of

        if os.environ.get("CORPUS_TOKEN_COUNTER", "auto") == "tokenizers":
            self.twin_refusal = "CORPUS_TOKEN_COUNTER=tokenizers"
            return None
        try:
            return twin_of(self.tokenizer_dir / "tokenizer.json", self.tokenizer)
        except NoTwin as why:
            self.twin_refusal = str(why)
            return None

    def fast_encode(self, texts: Sequence[str], *, guard_texts: int | None = None) -> list[list[int]]:
        """Token ids of rendered texts (as ``encode``), by the tiktoken twin where it is exact. The twin's first
        use on this renderer is checked id for id against ``tokenizers`` on its first ``guard_texts`` texts
        (None: all of them), a last guard on top of ``twin_of``'s checks: on any difference the twin is
        dropped for good and ``tokenizers`` encodes."""
        twin = self.twin
        if twin is None or not texts:
            return self.encode(texts)

        # Whole slices per thread: tiktoken's own encode_batch costs a future per text.
        def run(part: Sequence[str]) -> list[list[int]]:
            return [twin.encode(text, allowed_special="all") for text in part]

        step = -(-len(texts) // TWIN_THREADS)
        ids = list(chain.from_iterable(self._twin_threads.map(run, [texts[i:i + step]
                                                                    for i in range(0, len(texts), step)])))
        if not self._twin_checked:
            self._twin_checked = True
            checked = len(texts) if guard_texts is None else guard_texts
            expected = self.encode(texts[:checked])
            if ids[:checked] != expected:
                first = next(i for i, (a, b) in enumerate(zip(ids, expected, strict=False)) if a != b)
                self.twin, self.twin_refusal = None, f"tiktoken differed from tokenizers on text {first}"
                warnings.warn(f"token counts fall back to tokenizers: {self.twin_refusal}", RuntimeWarning,
                              stacklevel=2)
                return expected if checked >= len(texts) else self.encode(texts)
        return ids

    @cached_property
    def cut_problem(self) -> str | None:
        """Why a rendered text cut right after an added token might not encode as the whole text does, or None
        (``twin.cut_problem``)."""
        from .twin import cut_problem

        return cut_problem(self.tokenizer_dir / "tokenizer.json")

    @cached_property
    def longest_token(self) -> int:
        """Characters in the longest vocabulary entry: no token covers more characters of a text."""
        return max(len(text) for text in self.tokenizer.get_vocab(with_added_tokens=True))

    def token_lower_bound(self, conversation: Conversation) -> int:
        """A cheap floor on the conversation's length in tokens, from its characters alone (nothing rendered
        or tokenized): a row far over a budget is known to be over without tokenizing it whole."""
        characters = sum(len(m.content) + len(m.reasoning or "") for m in conversation.messages)
        return characters // self.longest_token

    def count_tokens(self, conversations: Sequence[Conversation]) -> list[int]:
        """Each conversation's length in the target's tokens: its longest served view (its views rendered while
        the previous chunk's are counted, ``encode_overlapped``)."""
        owners: list[int] = []

        def views() -> Iterable[list[str]]:
            for start in range(0, len(conversations), ENCODE_CHUNK):
                chunk: list[str] = []
                for index in range(start, min(start + ENCODE_CHUNK, len(conversations))):
                    rendered = self.budget_views(conversations[index])
                    chunk += rendered
                    owners.extend([index] * len(rendered))
                yield chunk

        def count(texts: Sequence[str]) -> list[int]:  # on the encoding thread: no ids kept
            return [len(ids) for ids in self.fast_encode(texts)]

        counts = [0] * len(conversations)
        for owner, length in zip(owners, self.encode_overlapped(views(), count), strict=True):
            counts[owner] = max(counts[owner], length)
        return counts

    def encode_overlapped(self, chunks: Iterable[Sequence[str]], encode: Callable[[Sequence[str]], list[T]]
                          ) -> list[T]:
        """``encode`` of every chunk, concatenated in order. Making a chunk (rendering: Python, holds the GIL)
        overlaps the encoding of the previous one on a worker thread (the Rust tokenizer and tiktoken release
        the GIL), so the cost is close to encoding alone."""
        _ = self.twin  # chosen here, not on the encoding thread
        results: list[T] = []
        pending: Future[list[T]] | None = None
        for chunk in chunks:
            if pending is not None:
                results += pending.result()
            pending = self._encoder.submit(encode, chunk)
        if pending is not None:
            results += pending.result()
        return results
