"""The sources stage: stream rows from local files or the Hub and normalise them into ``Conversation``.

``iter_source`` reads one recipe source; ``iter_file`` one raw file (``corpus audit FILE``);
``replay_stream`` the parts of a recipe's replay sources, on several processes when that pays. Bad rows come
out as ``errors.Skipped`` with a reason from ``errors.REASONS``; problems with a whole file or source
raise ``errors.CorpusError``.
"""

from .parallel import MeasuredRows, replay_stream
from .source import iter_file, iter_source, prompt_stream, resolve_paths

__all__ = ["MeasuredRows", "iter_file", "iter_source", "prompt_stream", "replay_stream", "resolve_paths"]
