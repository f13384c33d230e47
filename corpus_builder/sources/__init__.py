"""Sources: stream rows from local files or the Hub and normalise them into ``Conversation``.

``iter_source`` reads one recipe source; ``iter_file`` one raw file (``corpus audit FILE``). Bad rows
come out as ``errors.Skipped`` with a reason from ``errors.REASONS``; problems with a whole file or
source raise ``errors.CorpusError``.
"""

from .stream import count_rows, iter_file, iter_source, resolve_paths, source_parts

__all__ = ["count_rows", "iter_file", "iter_source", "resolve_paths", "source_parts"]
