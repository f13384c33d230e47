"""The screening stage: what decides, row by row, whether a conversation enters a corpus, shared by the build
and the audit (which counts what a build of a raw file would drop).

``checks`` is the screen, a per-batch stage (unclosed think blocks, length in target tokens, contamination, the
eval pack's copies), which gives ``screened`` batches; ``ids`` and ``dedup`` are keyed stages: the ids rows are
written under, and the cross-source dedup with its source priority (and the eval sets it reads); ``stream`` runs
the screen and the keyed stages over a stream in priority order; ``near_dedup`` the exact and MinHash/LSH indexes;
``decontaminate`` the n-gram index of evaluation sets; ``normalise`` the text all of them compare and the hashes of
its word runs.
"""
