"""The Python API reference: what ``corpus_builder`` exports (``__all__``), each name with its signature and its
docstring, a class with its fields and its public methods; grouped by the module that defines it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from types import ModuleType

from .markdown import cell, table

# The package root is what this page documents: it is read as a module object (its __all__ and where each name
# lives), never imported from, so no name goes through the lazy front door here.
ROOT = "corpus_builder"


def render_python_api() -> str:
    root = importlib.import_module(ROOT)
    intro = (f"Everything the commands do is a function of `{ROOT}`; the CLI is a thin layer over it. Importing the "
             "package loads nothing until a name is used. These are the names it exports (`__all__`), with the "
             "docstrings they carry in the code, grouped by the module that defines them.")
    by_module: dict[str, list[str]] = {}
    for name in root.__all__:
        by_module.setdefault(_defining_module(root, name), []).append(name)
    sections = [f"# Python API\n\n{intro}"]
    for module_name in sorted(by_module):
        module = importlib.import_module(module_name)
        sections.append(f"## `{module_name}`\n\n{_summary(module)}")
        sections += [_entry(name, getattr(root, name)) for name in by_module[module_name]]
    return "\n\n".join(sections) + "\n"


def _defining_module(root: ModuleType, name: str) -> str:
    """Where the root finds ``name`` (its lazy table), the subpackage the user imports it from."""
    table_of_names: dict[str, str] = vars(root)["_API"]
    return table_of_names[name]


def _summary(module: ModuleType) -> str:
    doc = inspect.getdoc(module) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def _entry(name: str, value: Callable[..., object]) -> str:
    kind = "class" if inspect.isclass(value) else "function"
    parts = [f"### `{name}`", f"```python\n{_signature(name, value, kind)}\n```"]
    doc = _own_doc(value)
    if doc:
        parts.append(doc)
    if inspect.isclass(value):
        if dataclasses.is_dataclass(value):
            parts.append(_fields(value))
        methods = _methods(value)
        if methods:
            parts.append(methods)
    return "\n\n".join(parts)


def _signature(name: str, value: Callable[..., object], kind: str) -> str:
    """``def name(...) -> R`` (one parameter a line when long); a dataclass is ``class Name`` (its fields follow)."""
    if kind == "class" and dataclasses.is_dataclass(value):
        return f"class {name}"
    signature = inspect.signature(value)
    parameters: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.name in ("self", "cls"):
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not any(p.startswith("*") for p in parameters):
            parameters.append("*")
        parameters.append(_parameter(parameter))
    returns = "" if kind == "class" or signature.return_annotation is inspect.Signature.empty else \
        f" -> {_annotation(signature.return_annotation)}"
    head = f"{'class' if kind == 'class' else 'def'} {name}"
    one_line = f"{head}({', '.join(parameters)}){returns}"
    if len(one_line) <= 100:
        return one_line
    return head + "(\n" + "".join(f"    {parameter},\n" for parameter in parameters) + f"){returns}"


def _parameter(parameter: inspect.Parameter) -> str:
    text = parameter.name
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        text = f"*{text}"
    elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
        text = f"**{text}"
    if parameter.annotation is not inspect.Parameter.empty:
        text += f": {_annotation(parameter.annotation)}"
    if parameter.default is not inspect.Parameter.empty:
        text += f" = {parameter.default!r}"
    return text


def _annotation(annotation: object) -> str:
    """An annotation as written in the code (they are strings under ``from __future__ import annotations``)."""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _own_doc(value: object) -> str:
    """The docstring written for ``value``; a dataclass's generated one (its signature) is none."""
    doc = inspect.getdoc(value) or ""
    if inspect.isclass(value) and doc.startswith(f"{value.__name__}("):
        return ""
    return doc


def _fields(cls: type) -> str:
    rows = []
    for field in dataclasses.fields(cls):
        if field.name.startswith("_"):
            continue
        if field.default is not dataclasses.MISSING:
            default = f"`{field.default!r}`"
        elif field.default_factory is not dataclasses.MISSING:
            default = f"`{getattr(field.default_factory, '__name__', 'factory')}()`"
        else:
            default = ""
        annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
        rows.append((f"`{field.name}`", f"`{cell(annotation)}`", default))
    return table(("field", "type", "default"), rows)


def _methods(cls: type) -> str:
    lines = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        function = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        if isinstance(member, property):
            doc = inspect.getdoc(member.fget) or ""
            lines.append(f"- `{name}` (property){': ' + _first_paragraph(doc) if doc else ''}")
        elif inspect.isfunction(function):
            signature = _signature(name, function, "function").removeprefix(f"def {name}")
            doc = inspect.getdoc(function) or ""
            lines.append(f"- `{name}{signature}`{': ' + _first_paragraph(doc) if doc else ''}")
    return "\n".join(lines)


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())
