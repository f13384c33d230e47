"""What a run, a comparison or a profile writes: JSON values (read-only, so a list of strings is one). A leaf of the
eval package: the figures and the run both write them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

Json: TypeAlias = "str | int | float | bool | Sequence[Json] | Mapping[str, Json] | None"
JsonObject: TypeAlias = dict[str, Json]
