"""The screening stage: what decides, row by row, whether a conversation enters a corpus, shared by the build
and the audit (which counts what a build of a raw file would drop).

``checks`` runs the row checks in order (redaction, unclosed think blocks, length in target tokens, exact and
near duplicates, contamination); ``dedup`` is the cross-source dedup with its source priority and the eval sets
it reads; ``near_dedup`` the exact and MinHash/LSH indexes; ``decontaminate`` the n-gram index of evaluation
sets; ``normalise`` the text all of them compare and the hashes of its word runs.
"""
