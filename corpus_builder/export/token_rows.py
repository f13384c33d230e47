"""Token rows of a built corpus on a tokenizer chosen after the build, shared by the token export and the
draft vocabulary."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import CorpusError
from ..layout import Corpus
from ..records import Conversation
from ..tokens import ConversationTokens, TemplateRenderer, TokenRows, TokenSettings, TurnRow


class CorpusTokenRows(TokenRows):
    """Token rows of a built corpus on a tokenizer chosen after the build. Its generated turns carry the ids
    the target served, in the target's tokenizer: a served id this tokenizer does not have means another
    vocabulary, and rows of both would be mixed, so it is refused (for `speculators-tokens` and `corpus vocab`
    alike)."""

    def __init__(self, renderer: TemplateRenderer, corpus: Corpus) -> None:
        super().__init__(renderer)
        self.corpus = corpus
        self.vocab_size: int = renderer.tokenizer.get_vocab_size(with_added_tokens=True)

    def tokenize(self, conversations: Sequence[Conversation]) -> list[ConversationTokens]:
        items = super().tokenize(conversations)
        for item in items:
            for row in item.rows:
                if row.served and max(row.input_ids, default=0) >= self.vocab_size:
                    raise self._foreign_ids(row)
        return items

    def _foreign_ids(self, row: TurnRow) -> CorpusError:
        served = TokenSettings.from_corpus(self.corpus)  # the build's: the path audit.json recorded, or the recipe's
        if served is None:
            target = "the build's target.tokenizer (not found here)"
        else:
            entries = served.renderer().tokenizer.get_vocab_size(with_added_tokens=True)
            target = f"the build's target.tokenizer {served.tokenizer} ({entries:,} entries)"
        return CorpusError(f"row {row.id}: served token id {max(row.input_ids):,} is outside the {self.vocab_size:,} "
                           f"entries of the tokenizer {self.renderer.tokenizer_dir}, so the ids the target served (in "
                           f"{target}) and the ones rendered here would be of two vocabularies: use the target's "
                           "tokenizer (--tokenizer DIR)", file=str(self.corpus.root))


# A Hub model id (ORG/NAME), which --tokenizer does not fetch.
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def check_tokenizer_dir(tokenizer: Path) -> Path:
    """``--tokenizer`` as given, once it is a directory with a tokenizer.json: a missing path (a Hub id, a typo) or
    another file is named for what it is, not found wanting a chat template."""
    if not tokenizer.exists():
        hub = (" (it reads like a Hub model id: --tokenizer takes a local directory; download the model first, e.g. "
               f"huggingface-cli download {tokenizer} --local-dir DIR)") if _HUB_ID.fullmatch(str(tokenizer)) else ""
        raise CorpusError(f"--tokenizer: no such directory{hub}", file=str(tokenizer))
    if not tokenizer.is_dir():
        raise CorpusError("--tokenizer: not a directory (give the target model's directory, which holds its "
                          "tokenizer.json)", file=str(tokenizer))
    if not (tokenizer / "tokenizer.json").is_file():
        raise CorpusError("--tokenizer: no tokenizer.json in this directory (give the target model's directory, "
                          "which holds it)", file=str(tokenizer))
    return tokenizer


def tokenizer_entries(tokenizer: Path) -> int:
    """How many entries the tokenizer in ``tokenizer`` (a checked directory) holds, added tokens included: the ids
    it can give are below this."""
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size(with_added_tokens=True))


def corpus_token_rows(corpus: Corpus, tokenizer: Path | None = None) -> CorpusTokenRows | None:
    """Token rows on the tokenizer a built corpus's recipe names (``tokenizer`` overrides, checked first); None
    when no such tokenizer is found here."""
    settings = TokenSettings.from_corpus(corpus, check_tokenizer_dir(tokenizer) if tokenizer is not None else None)
    return CorpusTokenRows(settings.renderer(), corpus) if settings is not None else None
