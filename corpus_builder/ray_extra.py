"""The Ray engine's modules, imported only when a command asks for ``--engine ray``."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import CorpusError


def ray_engine(module: str, command: str) -> ModuleType:
    """The Ray engine's ``module`` (e.g. ``corpus_builder.build.ray_data``), or a CorpusError saying how to install
    Ray Data when it is missing (``command``: what to run with ``--engine local`` instead)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] != "ray":
            raise
        raise CorpusError("the Ray engine needs Ray Data, which is not installed: pip install "
                          f"'corpus-builder[ray]' (or {command} with --engine local)") from None
