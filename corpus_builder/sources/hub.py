"""Hub sources: the rows of one split of a Hugging Face dataset, streamed with ``datasets``.

``datasets`` is imported only when a hub source is read (``pip install 'corpus-builder[hub]'``).

Offline use and mirrors: when the environment variable ``CORPUS_HUB_MIRROR`` names a directory, a hub
id ``ORG/NAME`` is read from ``$CORPUS_HUB_MIRROR/ORG/NAME`` instead of the Hub, with no network at all.
That directory is a snapshot of the dataset repository, for example what
``huggingface-cli download --repo-type dataset ORG/NAME --local-dir $CORPUS_HUB_MIRROR/ORG/NAME`` writes:
data files (``data/train-00000-of-00001.parquet``, ``train.jsonl``, ...) and, optionally, a README.md
whose ``configs`` name the configs and splits. ``datasets`` loads it with the same ``name`` (config) and
``split`` as the Hub would. The recipe's ``revision`` is still recorded in provenance, but a mirror
holds one snapshot, so it is not checked against it. A hub id missing from the mirror is an error: the
build never falls back to the network behind the user's back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import CorpusError, MissingDependency
from ..recipe.model import HubRef
from ..records import HubOrigin
from .readers import PositionFilter

MIRROR_ENV = "CORPUS_HUB_MIRROR"


def hub_label(ref: HubRef) -> str:
    """How a hub split is named in locations (``ORG/NAME[/CONFIG]/SPLIT#row``)."""
    return hub_provenance(ref).location()


def hub_provenance(ref: HubRef) -> HubOrigin:
    return HubOrigin(ref.id, ref.config, ref.split, ref.revision)


def mirror_dir(ref: HubRef, source: str) -> Path | None:
    """The local snapshot to read instead of the Hub, or None when no mirror is configured."""
    root = os.environ.get(MIRROR_ENV)
    if not root:
        return None
    local = Path(root, *ref.id.split("/"))
    if not local.is_dir():
        raise CorpusError(f"source '{source}': hub dataset {ref.id} is not in the mirror "
                          f"({MIRROR_ENV}={root}): no directory {local}")
    return local


def iter_hub_rows(ref: HubRef, source: str, keep: PositionFilter | None = None) -> Iterator[tuple[int, object]]:
    """Stream ``(row index, row)`` from the split; an empty split is an error, as an empty file is."""
    rows = iter(_load(ref, source))
    index = -1
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except Exception as error:  # datasets raises many types for unreachable or broken data
            raise _load_error(ref, source, error) from error
        index += 1
        if keep is None or keep(index):
            yield index, row
    if index < 0:
        raise CorpusError(f"source '{source}': hub dataset {hub_label(ref)} has no rows")


def _load(ref: HubRef, source: str) -> Iterable[object]:
    try:
        import datasets
    except ImportError:
        raise MissingDependency("datasets", "hub", f"source '{source}' (hub dataset {ref.id})") from None
    local = mirror_dir(ref, source)
    where, revision = (str(local), None) if local is not None else (ref.id, ref.revision)
    try:
        rows: Iterable[object] = datasets.load_dataset(where, name=ref.config, split=ref.split, revision=revision,
                                                        streaming=True)
    except Exception as error:  # not found, bad config or split, no network: all fixable by the user
        raise _load_error(ref, source, error) from error
    return rows


def _load_error(ref: HubRef, source: str, error: Exception) -> CorpusError:
    return CorpusError(f"source '{source}': cannot read hub dataset {hub_label(ref)}: "
                       f"{type(error).__name__}: {error}")
