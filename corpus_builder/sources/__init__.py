"""The sources stage: stream rows from local files or the Hub and normalise them into ``Conversation``.

``iter_source`` reads one recipe source; ``iter_file`` one raw file (``corpus audit FILE``);
``replay_stream`` the parts of a recipe's replay sources, on several processes when that pays. Every file is read
through its format (``formats``: one registry, ``format_of`` decides); ``raw_batches`` of a format and a
``BatchNormaliser`` give a file's rows in batches, as columns and as conversations (``corpus audit --against``).
Bad rows come out as ``errors.Skipped`` with a reason from ``errors.REASONS``; problems with a whole file or source
raise ``errors.CorpusError``.
"""

from .batches import BatchNormaliser, Normalised, SharedFold
from .formats import AUTO, Format, SplittableFormat, format_of, register
from .hub import hub_label, iter_hub_rows
from .mappings import TURN_KEYS, Layout, first_layout
from .parallel import MeasuredRows, replay_stream
from .raw import PARQUET_BATCH_ROWS, RawBatch, read_ahead, value_batches
from .source import iter_file, iter_source, prompt_stream, resolve_paths

__all__ = ["AUTO", "PARQUET_BATCH_ROWS", "TURN_KEYS", "BatchNormaliser", "Format", "Layout", "MeasuredRows",
           "Normalised", "RawBatch", "SharedFold", "SplittableFormat", "first_layout", "format_of", "hub_label",
           "iter_file", "iter_hub_rows", "iter_source", "prompt_stream", "read_ahead", "register", "replay_stream",
           "resolve_paths", "value_batches"]
