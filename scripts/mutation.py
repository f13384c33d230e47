"""Mutation testing with mutmut 3 ([tool.mutmut] in pyproject.toml), then the score of each module.

    python scripts/mutation.py [MODULE ...] [--tests PATH ...] [--max-children N] [--rejudge]
                               [--survivors | --report]

MODULE is a file of [tool.mutmut].only_mutate (default: every one); in the files FUNCTIONS lists, only those
functions' mutants are run and scored. The tests mutmut maps to the mutated functions are the fast tests that
own the chosen modules (OWNING_TESTS; --tests names others): the suite's end-to-end tests call every stage,
and would make each mutant run them all. --survivors runs again only the mutants that
survived the last run (after new tests), --report runs nothing; both then print the scores. mutmut keeps its
state in mutants/ (git-ignored): a later run re-tests only the functions that changed; delete it to start over.

A mutant is a one-line slip (a comparison, a constant, a dropped argument) in a copy of the tree; the tests
that call the function must then fail. A survivor is either a promise no test holds or an equivalent mutant:
one no behaviour can tell apart (only speed, or a message nobody reads). EQUIVALENT lists the ones judged so,
each with a line of its diff (checked, so a renumbered mutant is judged again) and the reason. The score is
killed / (total - equivalent); timeouts count as killed, as mutmut counts them. A mutant judged equivalent is
not run again (its tests would all pass, the costliest run a mutant has): its diff is checked instead, and one
whose diff no longer adds the line it was judged on is reported, to be judged again; --rejudge runs them all.
Needs the `mutation` extra (pip install -e '.[mutation]'). Exit 1 when a mutant that is not listed as equivalent
survives.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Files where issue 19 names some functions only: their mutant-name globs (mutmut names a function's
# mutants MODULE.x_NAME__mutmut_N, a method's MODULE.xǁCLASSǁNAME__mutmut_N).
FUNCTIONS: dict[str, tuple[str, ...]] = {
    # The comparison of the two sides and the suggestions drawn from it, and the --max-divergence verdict.
    "corpus_builder/audit/traffic.py": (
        "total_variation", "_divergence", "_frequency_tvd", "_curve", "_points", "_vocab_alone", "_vocab",
        "compare", "_dropped_by_source", "_recipe", "_plan", "_split_rows", "_recipe_diff", "_token_suggestions",
        "divergence_problems"),
    # The tool-call handling of the row mappings.
    "corpus_builder/sources/mappings.py": (
        "_json_value", "_declares_calls", "_turn_calls", "_calls", "_tool_call_id", "_link_tool_results",
        "_parallel_results"),
}

_SCREENING_TESTS = ("tests/screen",)

# The fast tests that own each module: a mutant runs those of them that call its function.
OWNING_TESTS: dict[str, tuple[str, ...]] = {
    "corpus_builder/publish/gate.py": ("tests/publish",),
    "corpus_builder/assemble/mixture.py": ("tests/assemble/test_mixture.py",),
    # the comparison's properties and profiles read from files: the tests that build a corpus take minutes each
    "corpus_builder/audit/traffic.py": ("tests/audit/test_traffic_promises.py",),
    # Dedup and decontamination share their tests (dedup.py reads the eval sets, decontaminate.py runs on
    # near_dedup's word runs), and one set for the three keeps mutmut's verdicts when they are run one at a time.
    "corpus_builder/screen/dedup.py": _SCREENING_TESTS,
    "corpus_builder/screen/near_dedup.py": _SCREENING_TESTS,
    "corpus_builder/screen/normalise.py": _SCREENING_TESTS,
    "corpus_builder/screen/decontaminate.py": _SCREENING_TESTS,
    "corpus_builder/sources/mappings.py": ("tests/sources",),
    "corpus_builder/generate/tool_results.py": ("tests/generate/test_tool_results.py", "tests/sources"),
    "corpus_builder/secrets.py": ("tests/test_secrets.py", "tests/publish"),
    # the fold and the logged exchanges: the readers' tests (the traffic audit reads them through the same functions)
    "corpus_builder/sources/fold.py": ("tests/sources",),
    "corpus_builder/sources/logs.py": ("tests/sources",),
    "corpus_builder/export/vocab.py": ("tests/export/test_vocab.py",),
    # The eval: the rules against scripted servers (no vLLM); the cut on its own, without building a corpus.
    "corpus_builder/eval/figures.py": ("tests/eval/test_figures.py",),
    "corpus_builder/eval/metrics.py": ("tests/eval/test_metrics.py",),
    "corpus_builder/eval/replay.py": ("tests/eval/test_replay.py", "tests/eval/test_eval_counters.py",
                                      "tests/eval/test_eval_faults.py", "tests/eval/test_eval_losses.py"),
    "corpus_builder/eval/pack.py": ("tests/eval/test_pack.py",),
    "corpus_builder/assemble/eval_pack.py": ("tests/assemble/test_eval_pack_cut.py",),
}

# Reasons shared by several mutants of one module (dedup, near_dedup, decontaminate).
_ALL_TURNS = 'conversation_text reads every value of turns but "prompt" as all turns'
_ONE_PER_KEY = "keys are one per row (a strict zip) and index.decide answers one per key or raises"
_ONE_PER_SET = "the index sums up each set read, in order: one summary per read"
_NO_DETAILS = ("the readers of a file or a Hub split raise no CorpusError with details: an eval set's error "
               "has none either way")
_ABSENT = "an absent row is read only as negative (< 0, >= 0), never as a row"
_INT64 = "np.full of the Python int -1 is int64, numpy's default integer: the same array"
_ARANGE = "np.arange of Python ints is int64, numpy's default integer: the same ordinals"
_RUNS = ("when runs merge: a lookup finds each hash, unique across runs, in whichever run holds it, and nbytes sums "
         "the runs; speed and a merge's temporary memory only")
_GROWTH = "how much the map grows by: large enough either way; speed and address space only"
_ODD_FOLD = ("other fixed odd multipliers: each a bijection of 64-bit values, so equal bands fold alike and unequal "
             "ones collide as rarely; no band hash value is promised")
_EVEN_FOLD = ("MinHash values are 32-bit: multipliers with at most 11 factors of 2 (checked: the first 256 draws) "
              "give each value of a position its own product; no band hash value is promised")
_SAME_DRAWS = "integers(high) draws from [0, high) as integers(0, high) does: the same multipliers"
_NEGATIVE_SIZE = "numpy reads any negative size as the one to infer"
_UINT64_SUM = "numpy sums uint64 in uint64"
_LE_BYTES = 'sketches are uint64 already: native "<u8" on the little-endian machines the project runs on'
_KEY_ENDS = 'the ends are stored as astype("<u8") of the sums: the same bytes from int64 sums'
_FLOAT_ONES = "_pack copies the fields into uint64 words: float ones pack as integer ones"
_FIRST_TABLE = "the first table serves only a batch of no bytes, whose prefix sums multiply nothing by it"
_TABLE_OF_TWO = "a first table of two serves batches of at most one byte, which read its first power (1) alone"
_UINT64_BASES = "numpy infers uint64 for either base (both exceed 2^63): the same powers"
_FLOAT_EDGES = "0/1 flags differenced as float64 give the same -1, 0 and 1 as int8: only memory"
_DISTINCT_STARTS = ("the run starts sorted are distinct (a text shorter than n starts no full run): every sort gives "
                    "one order")
_ROLES_BY_HAND = ("the fast path's TypeError falls to the per-turn loop, which reads the same roles (None for a turn "
                  "without one): speed only")
_TEXT_BY_HAND = ("the fast path's TypeError (orjson's JSONEncodeError is TypeError) falls to the turns' repr, as "
                 "injective on JSON values within one process as orjson's bytes: the same keys, slower")
_SHORTER = ("a text shorter than the runs looked up hashes fewer words than every entry of that length: no match "
            "either way")

_BATCHES = ("when the gathered rows are counted: the sums are the same whatever the batches (test_counting_in_batches_"
            "of_any_size_gives_the_same_figures); memory only")
_FLOAT_COUNTS = ("the fitted counts are read only as Python ints (token_freq.pt) and by their order (top_k): float64 "
                 "holds every count below 2^53 exactly, so the same three files")
_FLOATS = ("the windows' counts and seconds are floats (or NaN): numpy makes the array float64 without being told, "
           "and a true division of integers is a float anyway")
_RECHECK = ("the pool's recheck loop re-probes endpoints marked down; the eval's one endpoint is never marked down "
            "while the eval goes on (a failing request ends it): the loop, on or off, sends nothing")
_PROBLEM = "every pass of the loop that reaches its end sets the problem first: its first value is never shown"
_ONE_OUTCOME = "asyncio.gather gives one outcome a prompt: zip's strictness never applies"
_PADDED = "both sides are padded to one width first: zip's strictness never applies"

# Survivors judged equivalent: mutant name -> (a line its diff adds, why no behaviour tells it apart).
EQUIVALENT: dict[str, tuple[str, str]] = {
    # corpus_builder/sources/fold.py
    "corpus_builder.sources.fold.x__roles__mutmut_1": ("return list(None)", _ROLES_BY_HAND),
    "corpus_builder.sources.fold.x__roles__mutmut_2": ("return list(map(None, messages))", _ROLES_BY_HAND),
    "corpus_builder.sources.fold.x__roles__mutmut_3": ("return list(map(_ROLE, None))", _ROLES_BY_HAND),
    "corpus_builder.sources.fold.x__roles__mutmut_4": ("return list(map(messages))", _ROLES_BY_HAND),
    "corpus_builder.sources.fold.x__roles__mutmut_5": ("return list(map(_ROLE, ))", _ROLES_BY_HAND),
    "corpus_builder.sources.fold.x__serialised__mutmut_1": ("return tuple(None)", _TEXT_BY_HAND),
    "corpus_builder.sources.fold.x__serialised__mutmut_2": ("return tuple(map(None, messages))", _TEXT_BY_HAND),
    "corpus_builder.sources.fold.x__serialised__mutmut_3": ("return tuple(map(orjson.dumps, None))", _TEXT_BY_HAND),
    "corpus_builder.sources.fold.x__serialised__mutmut_4": ("return tuple(map(messages))", _TEXT_BY_HAND),
    "corpus_builder.sources.fold.x__serialised__mutmut_5": ("return tuple(map(orjson.dumps, ))", _TEXT_BY_HAND),
    "corpus_builder.sources.fold.x_exchange_keys__mutmut_30": (
        "head if (last == first) and False else", "with one answer in the history its key before the last answer is "
        "the head's, computed again: the same key, slower"),
    "corpus_builder.sources.fold.xǁPrefixFoldǁ_close_oldest__mutmut_2": (
        "popitem(last=None)", "OrderedDict.popitem reads last as a truth value: None pops the oldest, as False does"),
    # corpus_builder/export/vocab.py
    "corpus_builder.export.vocab.x_count_frequencies__mutmut_15": ("pending_rows = len(rows)", _BATCHES),
    "corpus_builder.export.vocab.x_count_frequencies__mutmut_16": ("pending_rows -= len(rows)", _BATCHES),
    "corpus_builder.export.vocab.x_count_frequencies__mutmut_5": ("pending_rows = 1", _BATCHES),
    "corpus_builder.export.vocab.x_count_frequencies__mutmut_17": ("pending_rows > ROWS_PER_COUNT", _BATCHES),
    "corpus_builder.export.vocab.x_count_frequencies__mutmut_23": ("pending, pending_rows = {}, 1", _BATCHES),
    "corpus_builder.export.vocab.x_iter_token_rows__mutmut_1": (
        "batch_size: int = 513", "the corpus read in batches of 513 rows, not 512: the same conversations, in order"),
    "corpus_builder.export.vocab.x_speculators_mappings__mutmut_10": ("np.arange(draft_size, dtype=None)", _ARANGE),
    "corpus_builder.export.vocab.x_speculators_mappings__mutmut_12": ("np.arange(draft_size, )", _ARANGE),
    "corpus_builder.export.vocab.x__fitted__mutmut_14": ("fitted = np.zeros(size, None)", _FLOAT_COUNTS),
    "corpus_builder.export.vocab.x__fitted__mutmut_16": ("fitted = np.zeros(size, )", _FLOAT_COUNTS),
    # corpus_builder/assemble/eval_pack.py
    "corpus_builder.assemble.eval_pack.x_cut_eval_pack__mutmut_57": (
        "if len(held) > _INDEX_BATCH:", "the pack's rows are indexed in batches of 1025 instead of 1024: the same "
        "index, memory only"),
    # corpus_builder/eval/replay.py
    "corpus_builder.eval.replay.x__server_info__mutmut_14": (
        "if (status == 200) or True else None", "a /server_info that does not answer 200 holds no vllm_config: "
        "vLLM's 404 outside development mode, read either way, gives no speculator"),
    "corpus_builder.eval.replay.x__server_info__mutmut_21": (
        'config = ""', "a config that is not an object, None or an empty string, tells nothing either way"),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_measured__mutmut_103": (
        "and _impossible(sent.counted, None) is None)", "the own counts are judged there only once they agree with "
        "the page, whose drafts and draft tokens passed the length rule already: only their other counts can "
        "still be impossible, and the length does not bear on those"),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_open__mutmut_12": ("concurrency=settings.concurrency, )", _RECHECK),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_open__mutmut_13": ("recheck_interval_s=1)", _RECHECK),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_read__mutmut_2": ("problem = None", _PROBLEM),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_read__mutmut_3": ('problem = "XXXX"', _PROBLEM),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_send__mutmut_45": ("outcomes, strict=None)", _ONE_OUTCOME),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_send__mutmut_48": ("zip(prompts, outcomes, )", _ONE_OUTCOME),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_send__mutmut_49": ("outcomes, strict=False)", _ONE_OUTCOME),
    "corpus_builder.eval.replay.xǁ_Replayerǁ_send__mutmut_61": (
        "request_counters(result.metrics, None)", "the generated tokens of a request's own counts are never read: a "
        "window's output tokens are the answers' usage"),
    # corpus_builder/eval/figures.py
    "corpus_builder.eval.figures.x_paired_ratios__mutmut_18": ("dtype=None)", _FLOATS),
    "corpus_builder.eval.figures.x_paired_ratios__mutmut_20": ("for side in (a, b)], )", _FLOATS),
    "corpus_builder.eval.figures.x_paired_ratios__mutmut_21": (
        "np.nan if (w.output_tokens is None) and False", "None in a float64 array is NaN already"),
    "corpus_builder.eval.figures.x_paired_ratios__mutmut_25": (
        "size=resamples).astype(None)", "astype(None) is float64, numpy's default float"),
    "corpus_builder.eval.figures.x_paired_ratios__mutmut_72": (
        "if not np.isfinite(ratio) and not resampled.size:", "counts are never negative: a ratio that is not "
        "finite comes from a column of A summing to 0 (or NaN), which every resample shares, so no resample is "
        "finite either; a finite ratio has finite resamples but where all 2000 miss every pair that drafted"),
    # corpus_builder/eval/metrics.py
    "corpus_builder.eval.metrics.x__samples__mutmut_29": (
        "line[close + 2:]", "Prometheus's text format puts a space between a label set and its value: one byte more "
        "skips that space, and the value is the first field after it either way"),
    "corpus_builder.eval.metrics.x__samples__mutmut_35": (
        'labels, rest = b"XXXX", line', "an unlabelled sample's labels are read only for a position label, which "
        "neither holds"),
    "corpus_builder.eval.metrics.x_parse_metrics__mutmut_57": (
        "default=-2", "range(-1) and range(0) are both empty: no position"),
    "corpus_builder.eval.metrics.x_parse_metrics__mutmut_61": (
        "page.rfind(", "whether the counter is on the page: the first or the last match, found either way"),
    "corpus_builder.eval.metrics.x_request_counters__mutmut_34": (
        "(metrics is not None) or True", "reached only when metrics held speculative_decoding: never None there"),
    "corpus_builder.eval.metrics.xǁCountersǁ_combined__mutmut_45": ("strict=None)", _PADDED),
    "corpus_builder.eval.metrics.xǁCountersǁ_combined__mutmut_48": ("zip(mine, theirs, ))", _PADDED),
    "corpus_builder.eval.metrics.xǁCountersǁ_combined__mutmut_49": ("strict=False)", _PADDED),
    "corpus_builder.publish.gate.x__sample_int_arrays__mutmut_3": (
        "len(value) >= 8", "an all-integer array of 8 validates the same whole or sampled: speed only"),
    "corpus_builder.publish.gate.x__sample_int_arrays__mutmut_4": (
        "len(value) > 9", "an all-integer array of 9 validates the same whole or sampled: speed only"),
    "corpus_builder.publish.gate.x__sample_int_arrays__mutmut_6": (
        "type(None) is int", "never sampling validates every array whole: the same verdicts, slower"),
    "corpus_builder.publish.gate.x__sample_int_arrays__mutmut_8": (
        "return value[:2]", "a sample of two items of a type-checked integer array: the same verdict"),
    "corpus_builder.publish.gate.x__check_rows__mutmut_20": (
        "batch_size=2049", "the batch size of the row pass: memory and speed only"),
    "corpus_builder.secrets.x__der_content__mutmut_1": (
        "len(der) <= 2", "a two-byte element has no content either way"),
    "corpus_builder.secrets.x__der_content__mutmut_2": (
        "len(der) < 3", "a two-byte element has no content either way"),
    "corpus_builder.secrets.x__may_contain_secret__mutmut_2": (
        "prefix not in text", "a prefilter that lets more texts through: the same findings, slower"),
    "corpus_builder.secrets.x_find_secrets__mutmut_6": (
        '"XXsecretXX"', "every alternative of the pattern is a named group: lastgroup is never None"),
    "corpus_builder.secrets.x_find_secrets__mutmut_7": (
        '"SECRET"', "every alternative of the pattern is a named group: lastgroup is never None"),
    "corpus_builder.secrets.x_iter_corpus_rows__mutmut_1": ("batch_size: int = 2049", "batching: memory only"),
    "corpus_builder.secrets.x_redact__mutmut_2": ("end = None", "text[None:i] is text[0:i]"),
    "corpus_builder.secrets.x_redact__mutmut_10": (
        "(pieces) or True", "with no secret the join is of text[0:] alone, which is text itself"),
    "corpus_builder.secrets.x_scan_corpus__mutmut_18": ('encoding="UTF-8"', "the same codec under another name"),
    # corpus_builder/screen/dedup.py
    "corpus_builder.screen.dedup.xǁDedupǁ__init____mutmut_1": ('"XXallXX") -> None', _ALL_TURNS),
    "corpus_builder.screen.dedup.xǁDedupǁ__init____mutmut_2": ('"ALL") -> None', _ALL_TURNS),
    "corpus_builder.screen.dedup.xǁDedupǁfor_recipe__mutmut_19": ('else "XXallXX"', _ALL_TURNS),
    "corpus_builder.screen.dedup.xǁDedupǁfor_recipe__mutmut_20": ('else "ALL"', _ALL_TURNS),
    "corpus_builder.screen.dedup.xǁDedupǁdecide__mutmut_6": (
        '"XX0XX"', '_parse_key reads the flag as thinking when it is "1", as not thinking otherwise'),
    "corpus_builder.screen.dedup.xǁDedupǁdecide__mutmut_18": ("signatures), strict=None)", _ONE_PER_KEY),
    "corpus_builder.screen.dedup.xǁDedupǁdecide__mutmut_22": ("self.index.decide(keys, signatures), )", _ONE_PER_KEY),
    "corpus_builder.screen.dedup.xǁDedupǁdecide__mutmut_27": ("signatures), strict=False)", _ONE_PER_KEY),
    "corpus_builder.screen.dedup.x_describe_eval_sets__mutmut_26": (
        "eval_sets.index.eval_sets, strict=None)", _ONE_PER_SET),
    "corpus_builder.screen.dedup.x_describe_eval_sets__mutmut_29": ("eval_sets.index.eval_sets, ))", _ONE_PER_SET),
    "corpus_builder.screen.dedup.x_describe_eval_sets__mutmut_30": (
        "eval_sets.index.eval_sets, strict=False)", _ONE_PER_SET),
    "corpus_builder.screen.dedup.x_read_eval_sets__mutmut_15": (
        "zip(reads, index.eval_sets, strict=None)", _ONE_PER_SET),
    "corpus_builder.screen.dedup.x_read_eval_sets__mutmut_18": ("zip(reads, index.eval_sets, ):", _ONE_PER_SET),
    "corpus_builder.screen.dedup.x_read_eval_sets__mutmut_19": (
        "zip(reads, index.eval_sets, strict=False)", _ONE_PER_SET),
    "corpus_builder.screen.dedup.xǁEvalSetReadǁtexts__mutmut_52": (
        "line=error.line, details=None) from None", _NO_DETAILS),
    "corpus_builder.screen.dedup.xǁEvalSetReadǁtexts__mutmut_56": ("line=error.line, ) from None", _NO_DETAILS),
    # corpus_builder/screen/near_dedup.py
    "corpus_builder.screen.near_dedup.xǁ_Pagesǁgather__mutmut_19": (
        ".reshape(-2, width)", _NEGATIVE_SIZE),
    "corpus_builder.screen.near_dedup.xǁ_Keysǁ__getitem____mutmut_3": (
        "if (index) or True else 0", 'for index 0 the slice [-8:0] is empty, and int.from_bytes(b"") is 0'),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁsimilar__mutmut_6": (
        "for shift in range(SKETCH_BITS):", "a shift of 0 ors the differing bits into themselves"),
    "corpus_builder.screen.near_dedup.x__merge__mutmut_1": (
        "if older[1] is None and newer[1] is None:", "a table's runs are all packed (no rows) or all whole: one run "
        "has rows exactly when the other has"),
    "corpus_builder.screen.near_dedup.x__merge__mutmut_10": (
        "entries.sort(kind=None)", "sorting plain integers: any algorithm gives the same array"),
    "corpus_builder.screen.near_dedup.x__merge__mutmut_12": (
        'entries.sort(kind="STABLE")', "numpy reads the kind's name in any case"),
    "corpus_builder.screen.near_dedup.x__merge__mutmut_29": (
        "from_older[landing] = None", "numpy stores None in a bool array as False"),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁ_hashes__mutmut_22": (".reshape(-2, 1)", _NEGATIVE_SIZE),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_29": (
        "integers(1 << 63, size=self.rows_per_band", _SAME_DRAWS),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_34": ("default_rng(1852137843)", _ODD_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_35": ("integers(1, 1 << 63,", _ODD_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_37": ("integers(0, 2 << 63,", _ODD_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_38": ("integers(0, 1 << 64,", _ODD_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_40": (
        "halves * np.uint64(2) - np.uint64(1)", _ODD_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_43": (
        "halves * np.uint64(3) + np.uint64(1)", _EVEN_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_45": (
        "halves * np.uint64(2) + np.uint64(2)", _EVEN_FOLD),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_58": (
        "np.uint64(11400714819323198486)", "another constant whose multiples by 1 to bands are distinct: the salts "
        "still differ by band"),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_60": (
        "_FirstSeen(whole_hashes=None)", "None is falsy: packed entries as False"),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_63": (
        "slice(1, None)", "the hashes have 1 + bands columns: the slice ends there either way"),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ__init____mutmut_68": (
        "slice(1, 2 + self.bands)", "the hashes have 1 + bands columns: a slice past them ends there"),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ_hashes__mutmut_39": (
        "- self._band_salts)", "subtracting distinct salts keeps the bands' hashes apart as adding them does; no band "
        "hash value is promised"),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ_hashes__mutmut_41": ("sum(axis=2, dtype=None)", _UINT64_SUM),
    "corpus_builder.screen.near_dedup.xǁNearDuplicatesǁ_hashes__mutmut_43": ("sum(axis=2, )", _UINT64_SUM),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_31": ("while (len(self._runs) > 2 and", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_32": ("while (len(self._runs) >= 3 and", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_33": (
        "len(self._runs[-2][0]) < 2 * len(self._runs[-1][0])", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_34": ("<= 2 / len(self._runs[-1][0])", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_35": ("<= 3 * len(self._runs[-1][0])", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_36": (
        "len(self._runs[-2][0]) - len(self._runs[-1][0]) <= RUN_ENTRIES", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_37": (
        "len(self._runs[-1][0]) < RUN_ENTRIES", _RUNS),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_4": (
        "found = np.full(len(queries), -1, dtype=None)", _INT64),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_7": ("found = np.full(len(queries), -1, )", _INT64),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_9": (
        "found = np.full(len(queries), -2, dtype=np.int64)", _ABSENT),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_10": (
        "if not self._runs and not len(queries):", "the early return saves work only: with no runs every row stays -1,"
        " with no queries there is none to find"),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_26": (
        "rows_of_ordered = np.full(len(queries), -1, dtype=None)", _INT64),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_29": (
        "rows_of_ordered = np.full(len(queries), -1, )", _INT64),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁfind__mutmut_31": (
        "rows_of_ordered = np.full(len(queries), -2, dtype=np.int64)", _ABSENT),
    "corpus_builder.screen.near_dedup.xǁ_FirstSeenǁadd_first__mutmut_3": (
        "keys = hashes if (self._whole) or True else", "band hashes of one batch alike in their high 32 bits are then "
        "all stored, packed with their rows: a lookup finds the least row of them, the first, as it would alone"),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁdecide__mutmut_7": (
        "len(self._keys) + len(keys), dtype=None)", _ARANGE),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁdecide__mutmut_10": ("len(self._keys) + len(keys), )", _ARANGE),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁlookup__mutmut_8": (
        "np.full(len(signatures), -1, dtype=None)", _INT64),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁlookup__mutmut_11": ("np.full(len(signatures), -1, ))", _INT64),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁlookup__mutmut_13": (
        "np.full(len(signatures), -2, dtype=np.int64)", "a text looked up is no row of the index: any negative "
        "ordinal is none of the heads (each a row, or -1 for none)"),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁheads__mutmut_4": (
        "found = np.full(signatures.hashes.shape, -1, dtype=None)", _INT64),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁheads__mutmut_7": (
        "found = np.full(signatures.hashes.shape, -1, )", _INT64),
    "corpus_builder.screen.near_dedup.xǁExactDuplicatesǁheads__mutmut_9": (
        "found = np.full(signatures.hashes.shape, -2, dtype=np.int64)", _ABSENT),
    "corpus_builder.screen.near_dedup.xǁ_Keysǁextend__mutmut_5": ("for key in encoded], dtype=None)", _KEY_ENDS),
    "corpus_builder.screen.near_dedup.xǁ_Keysǁextend__mutmut_7": ("for key in encoded], )", _KEY_ENDS),
    "corpus_builder.screen.near_dedup.xǁ_Pagesǁextend__mutmut_3": ("if end >= len(self._map):", _GROWTH),
    "corpus_builder.screen.near_dedup.xǁ_Pagesǁextend__mutmut_9": ("max(end, 2 / len(self._map))", _GROWTH),
    "corpus_builder.screen.near_dedup.xǁ_Pagesǁextend__mutmut_10": ("max(end, 3 * len(self._map))", _GROWTH),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ__init____mutmut_5": (
        "per_word = 65 // SKETCH_BITS", "65 // 4 is 16 as 64 // 4 is"),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ__init____mutmut_16": (
        "self.words * per_word), dtype=None)", _FLOAT_ONES),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ__init____mutmut_18": ("self.words * per_word), )", _FLOAT_ONES),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ__init____mutmut_21": (
        "outside[:, self.fields:] = 1", "sketch pads the last word with zero fields: the padding of two sketches "
        "always agrees"),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ__init____mutmut_44": (
        "for m in range(compared + 2)", "more agreeing values than are compared are reached with probability 0: never "
        "the cut"),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ__init____mutmut_51": (
        ") > CONFIRM_AT_THRESHOLD)", "the cut moves only if a binomial tail is exactly 0.99: never, in floats"),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁ_pack__mutmut_22": ("self.words, -2)", _NEGATIVE_SIZE),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁappend__mutmut_3": (
        "np.ascontiguousarray(sketches, dtype=None)", _LE_BYTES),
    "corpus_builder.screen.near_dedup.xǁ_Sketchesǁappend__mutmut_5": ("np.ascontiguousarray(sketches, )", _LE_BYTES),
    # corpus_builder/screen/normalise.py
    "corpus_builder.screen.normalise.xǁ_Powersǁ__init____mutmut_3": (
        "self._forward: U64 = np.ones(1, dtype=None)", _FIRST_TABLE),
    "corpus_builder.screen.normalise.xǁ_Powersǁ__init____mutmut_5": (
        "self._forward: U64 = np.ones(1, )", _FIRST_TABLE),
    "corpus_builder.screen.normalise.xǁ_Powersǁ__init____mutmut_6": (
        "self._forward: U64 = np.ones(2, dtype=np.uint64)", _TABLE_OF_TWO),
    "corpus_builder.screen.normalise.xǁ_Powersǁ__init____mutmut_12": (
        "self._inverse: U64 = np.ones(2, dtype=np.uint64)", _TABLE_OF_TWO),
    "corpus_builder.screen.normalise.x__powers_of__mutmut_12": ("base, dtype=None)", _UINT64_BASES),
    "corpus_builder.screen.normalise.x__powers_of__mutmut_15": ("np.full(size - 1, base, )", _UINT64_BASES),
    "corpus_builder.screen.normalise.x_conversation_text__mutmut_1": ('ConversationText = "XXallXX"', _ALL_TURNS),
    "corpus_builder.screen.normalise.x_conversation_text__mutmut_2": ('turns: ConversationText = "ALL"', _ALL_TURNS),
    "corpus_builder.screen.normalise.x_normalise_texts__mutmut_36": ("space.astype(None)", _FLOAT_EDGES),
    "corpus_builder.screen.normalise.xǁWordRunsǁ__init____mutmut_31": ("word.astype(None)", _FLOAT_EDGES),
    "corpus_builder.screen.normalise.xǁWordRunsǁ__init____mutmut_5": (
        "_POWERS.tables(len(data) + 2)", "tables one power longer: the same power at every index read"),
    "corpus_builder.screen.normalise.xǁWordRunsǁhashes__mutmut_28": ("np.argsort(runs, kind=None)", _DISTINCT_STARTS),
    "corpus_builder.screen.normalise.xǁWordRunsǁhashes__mutmut_30": ("np.argsort(runs, )", _DISTINCT_STARTS),
    "corpus_builder.screen.normalise.xǁWordRunsǁhashes__mutmut_32": ('argsort(runs, kind="STABLE")', _DISTINCT_STARTS),
    "corpus_builder.screen.normalise.xǁ_Powersǁtables__mutmut_1": (
        "if length < len(self._forward):", "a table exactly as long as asked is built again, longer: the same powers"),
    "corpus_builder.screen.normalise.xǁ_Powersǁtables__mutmut_11": (
        "min(2 / len(self._forward), self.KEPT)", "2 / len is at most 2 and a longer table is asked for at least 2: "
        "the tables grow to the length asked instead of doubling, the same powers rebuilt more often"),
    "corpus_builder.screen.normalise.xǁ_Powersǁtables__mutmut_12": (
        "min(3 * len(self._forward), self.KEPT)", "the tables grow threefold instead of twofold: the same powers"),
    "corpus_builder.screen.normalise.xǁ_Powersǁtables__mutmut_33": (
        "if size < self.KEPT:", "tables of exactly KEPT powers not kept between batches: the same powers, rebuilt"),
    # corpus_builder/screen/decontaminate.py
    "corpus_builder.screen.decontaminate.xǁContaminationǁchunk_matches__mutmut_5": ("whole_if_shorter=None)", _SHORTER),
    "corpus_builder.screen.decontaminate.xǁContaminationǁchunk_matches__mutmut_8": (
        "runs.hashes(length, whole_if_shorter=True)", _SHORTER),
    "corpus_builder.screen.decontaminate.xǁContaminationǁchunk_matches__mutmut_17": (
        "hashes[order], )", "side=\"left\" is searchsorted's default"),
    # corpus_builder/audit/traffic.py
    "corpus_builder.audit.traffic.x__plan__mutmut_54": (
        "targets.get(task, (0.0, 1.0))", "a task the traffic lacks wants 0 rows: its thinking share moves nothing"),
    "corpus_builder.audit.traffic.x__plan__mutmut_57": (
        "groups.get(task, None)", "members is read only after the empty check: None and [] are both empty"),
    "corpus_builder.audit.traffic.x__plan__mutmut_59": (
        "groups.get(task, )", "members is read only after the empty check: None and [] are both empty"),
    "corpus_builder.audit.traffic.x__plan__mutmut_87": (
        "if wanted else 1.0", "reached is read only when rows are wanted"),
    "corpus_builder.audit.traffic.x__plan__mutmut_97": (
        "thinking >= reached", "the mode is chosen only when the shares differ by more than the tolerance"),
    "corpus_builder.audit.traffic.x__points__mutmut_2": (
        "k <= size", "size is always a point: a standard point equal to it adds nothing to the set"),
    "corpus_builder.audit.traffic.x__recipe_diff__mutmut_70": (
        'take.get("fraction", 2)', "the default is read only without a fraction: 1 and 2 both mean the whole source"),
    "corpus_builder.audit.traffic.x__recipe_diff__mutmut_78": (
        'take.get("count") or 1)', "rows read count the kept rows (at least 1): read < 1 is false as read < 0 is"),
    "corpus_builder.audit.traffic.x__recipe_diff__mutmut_82": (
        'entry["change"] >= 0', "an entry without a change was skipped before: the change is never 0 here"),
    "corpus_builder.audit.traffic.x__recipe_diff__mutmut_147": ("sort_keys=None", "None is falsy: the order kept"),
    "corpus_builder.audit.traffic.x__split_rows__mutmut_48": (
        "if move >= 0 else", "a move is made only past the tolerance, so it is never 0"),
    "corpus_builder.audit.traffic.x__vocab__mutmut_9": (
        "top_k(corpus, None)", "top_k slices its order: [:None] and [:size] are the whole of it"),
    "corpus_builder.audit.traffic.x__vocab__mutmut_14": (
        "top_k(traffic, None)", "top_k slices its order: [:None] and [:size] are the whole of it"),
    "corpus_builder.audit.traffic.x__vocab__mutmut_27": (
        "points), strict=None)", "_curve gives one value per point: the zipped lengths always agree"),
    "corpus_builder.audit.traffic.x__vocab__mutmut_32": (
        "_curve(by_traffic, traffic, points), )", "_curve gives one value per point: the zipped lengths always agree"),
    "corpus_builder.audit.traffic.x__vocab__mutmut_51": (
        "points), strict=False)", "_curve gives one value per point: the zipped lengths always agree"),
    "corpus_builder.audit.traffic.x__vocab_alone__mutmut_9": (
        "top_k(counts, None)", "top_k slices its order: [:None] and [:size] are the whole of it"),
    "corpus_builder.audit.traffic.x__vocab_alone__mutmut_28": (
        "points), strict=None)]}", "_curve gives one value per point: the zipped lengths always agree"),
    "corpus_builder.audit.traffic.x__vocab_alone__mutmut_31": (
        "counts, points), )]}", "_curve gives one value per point: the zipped lengths always agree"),
    "corpus_builder.audit.traffic.x__vocab_alone__mutmut_38": (
        "points), strict=False)]}", "_curve gives one value per point: the zipped lengths always agree"),
    # corpus_builder/assemble/mixture.py
    "corpus_builder.assemble.mixture.x_apportion__mutmut_17": (
        "zip(sizes, parts, strict=None)", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_apportion__mutmut_20": (
        "zip(sizes, parts, ))", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_apportion__mutmut_21": (
        "zip(sizes, parts, strict=False)", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_14": (
        "for cell in range(5) if subset", "a set below 16 has no bit 4: the fifth cell is never summed"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_19": (
        "for subset in range(17)]", "most[16] is never read: the sets of cells are 1 to 15"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_24": (
        "validation_set = 0b0011, 13", "a validation size above what the validation cells hold is refused by "
        "_split_demand's own bound on that set: more sizes tried, the same one met"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_35": (
        "1 if (held[VALIDATION]) or True else 0", "called only when the whole meets the share and a split misses it: "
        "a split with no rows held is empty and met, the other is then the whole, so both are held"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_37": (
        "1 if held[VALIDATION] else 1", "called only when the whole meets the share and a split misses it: both "
        "splits are held here"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_45": (
        "1 if (held[TRAIN]) or True else 0", "called only when the whole meets the share and a split misses it: both "
        "splits are held here"),
    "corpus_builder.assemble.mixture.x__meet_each_split__mutmut_47": (
        "1 if held[TRAIN] else 1", "called only when the whole meets the share and a split misses it: both splits are "
        "held here"),
    "corpus_builder.assemble.mixture.x__split_demand__mutmut_28": (
        "for subset in range(16):", "the empty set of cells adds the bound 0 <= most[0] = 0, always met"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_15": (
        "while queue or end is None:", "the search goes on past a path and ends on a later one, as valid: the same "
        "cell totals, counts and caps; which source's rows move is not promised (the original moves are not the "
        "fewest either)"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_32": (
        "XXa demand within the transport bound has a pathXX", "the message of an assertion that holds: a demand "
        "within the transport bound has a path"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_33": (
        "A DEMAND WITHIN THE TRANSPORT BOUND HAS A PATH", "the message of an assertion that holds: a demand within "
        "the transport bound has a path"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_44": (
        "amount = min(demand[end] - held[end],", "an amount not capped by the surplus overshoots and a later path "
        "moves it back: the same cell totals, counts and caps, another valid choice of rows (not promised fewest)"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_45": (
        "amount = min(held[cell] - demand[cell], *(min(", "an amount not capped by the deficit overshoots and a later "
        "path moves it back: the same cell totals, counts and caps, another valid choice of rows (not promised "
        "fewest)"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_47": (
        "amount = min(held[cell] + demand[cell],", "an amount not capped by the surplus overshoots and a later path "
        "moves it back: the same cell totals, counts and caps, another valid choice of rows (not promised fewest)"),
    "corpus_builder.assemble.mixture.x__transport__mutmut_48": (
        "demand[end] + held[end],", "an amount not capped by the deficit overshoots and a later path moves it back: "
        "the same cell totals, counts and caps, another valid choice of rows (not promised fewest)"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_41": (
        "sum(b.plain for b in open_bounds), None)", "the label of the sources with no target as one bound is never "
        "shown: their message names them"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_49": (
        'sum(b.plain for b in open_bounds), "XXXX")', "the label of the sources with no target as one bound is never "
        "shown: their message names them"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_89": (
        'RowBounds(None, 0, 0, "")', "of the rows the sources with no target give, only the reasoning and plain "
        "bounds are read"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_92": (
        "RowBounds(0, 0, 0, None)", "the label of the empty bound is never shown"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_97": (
        'RowBounds(1, 0, 0, "")', "of the rows the sources with no target give, only the reasoning and plain bounds "
        "are read"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_100": (
        'RowBounds(0, 0, 0, "XXXX")', "the label of the empty bound is never shown"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_117": (
        "highest <= target.target - target.tolerance - 1e-9", "a ratio of row counts exactly 1e-9 under the "
        "tolerance's bound: never, in floats"),
    "corpus_builder.assemble.mixture.x_certain_shortfalls__mutmut_124": (
        "lowest >= target.target + target.tolerance + 1e-9", "a ratio of row counts exactly 1e-9 over the tolerance's "
        "bound: never, in floats"),
    "corpus_builder.assemble.mixture.x_next_round__mutmut_4": (
        "if missing < 0 or pool_left <= 0:", "with nothing missing the rounded-up shortfall is 0, or min(pool_left, "
        "0): 0 either way"),
    "corpus_builder.assemble.mixture.x_next_round__mutmut_6": (
        "if missing <= 0 or pool_left < 0:", "an empty pool caps the round at min(0, ...): 0 either way"),
    "corpus_builder.assemble.mixture.x_plan_selection__mutmut_106": (
        "zip(CELLS, cells, strict=None)", "a plan has one count per cell by construction: zip's strictness never "
        "applies"),
    "corpus_builder.assemble.mixture.x_plan_selection__mutmut_109": (
        "zip(CELLS, cells, ):", "a plan has one count per cell by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_plan_selection__mutmut_110": (
        "zip(CELLS, cells, strict=False)", "a plan has one count per cell by construction: zip's strictness never "
        "applies"),
    "corpus_builder.assemble.mixture.x_plan_selection__mutmut_138": (
        "(outcome.declared or 1)", "a share declared 0 rows has a quota under one row of at most as many rows "
        "written: no line either way"),
    "corpus_builder.assemble.mixture.x_plan_selection__mutmut_77": (
        "sum(wants.values()), None,", "needed is read only with no rows wanted, when there is nothing to move either "
        "way"),
    "corpus_builder.assemble.mixture.x_plan_selection__mutmut_85": (
        "sum(wants.values()), True,", "needed is read only with no rows wanted, when there is nothing to move either "
        "way"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_14": (
        "sizes.get(spec.name, None)", "every caller's sizes name every source: the default is never taken"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_16": (
        "sizes.get(spec.name, )", "every caller's sizes name every source: the default is never taken"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_17": (
        "sizes.get(spec.name, 1)", "every caller's sizes name every source: the default is never taken"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_28": (
        "if (shares) or True else fixed", "with no share the total is round(fixed / 1), fixed itself"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_47": (
        "dict(zip(shares, parts, strict=None))", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_50": (
        "dict(zip(shares, parts, ))", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_51": (
        "dict(zip(shares, parts, strict=False))", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_79": (
        "parts[:len(shares)], strict=None)", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_82": (
        "parts[:len(shares)], ))", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.x_resolve_counts__mutmut_83": (
        "parts[:len(shares)], strict=False)", "one part per name by construction: zip's strictness never applies"),
    "corpus_builder.assemble.mixture.xǁAvailableǁbest__mutmut_6": (
        "if rows > sum(len(priorities)", "asked for every row, the merge's last priority is the highest: every cell "
        "counts all its rows either way"),
}

SCORED = ("killed", "timeout")


def _configured_modules() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    return list(config["only_mutate"])


def _dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def _patterns(module: str) -> list[str]:
    dotted = _dotted(module)
    functions = FUNCTIONS.get(module)
    if functions is None:
        return [f"{dotted}.*"]
    return [f"{dotted}.{prefix}{name}__mutmut_*" for name in functions for prefix in ("x_", "xǁ*ǁ")]


def _selected(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _statuses(module: str) -> dict[str, str]:
    """The last run's status of each selected mutant of ``module`` (none before its first run)."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code

    data = SourceFileMutationData(path=module)
    data.load()
    patterns = _patterns(module)
    return {name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()
            if _selected(name, patterns)}


def _run(patterns: list[str], tests: list[str], max_children: int) -> None:
    from mutmut import configuration

    configuration.config().pytest_add_cli_args_test_selection = tests
    from mutmut.__main__ import cli

    cli(["run", "--max-children", str(max_children), *patterns], standalone_mode=False)


def _equivalent_holds(name: str, module: str, added: str) -> bool:
    """Whether the mutant called ``name`` still adds the line it was judged on."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=module)
    return any(line.startswith("+") and added in line for line in diff.splitlines())


def _report(modules: list[str]) -> bool:
    """Print the score of each module; whether every survivor is a listed equivalent."""
    clean = True
    print(f"\n{'module':<44} {'killed':>6} {'total':>6} {'equiv':>6} {'score':>7}  other")
    for module in modules:
        statuses = _statuses(module)
        survivors = sorted(name for name, status in statuses.items() if status == "survived")
        # a judged mutant is not run (tests/conftest.py gives it no test): mutmut calls it "no tests"
        judged = sorted(name for name, status in statuses.items() if status == "no tests" and name in EQUIVALENT)
        equivalent = [name for name in [*survivors, *judged] if name in EQUIVALENT
                      and _equivalent_holds(name, module, EQUIVALENT[name][0])]
        counts = Counter(statuses.values())
        counts["survived"] -= len(set(equivalent) & set(survivors))
        counts["no tests"] -= len(set(equivalent) & set(judged))
        killed = sum(counts[status] for status in SCORED)
        scored = len(statuses) - len(equivalent)
        score = f"{100 * killed / scored:.1f}%" if scored else "-"
        other = ", ".join(f"{count} {status}" for status, count in sorted(counts.items())
                          if count and status not in SCORED)
        print(f"{module:<44} {killed:>6} {len(statuses):>6} {len(equivalent):>6} {score:>7}  {other}")
        for name in survivors:
            if name not in equivalent:
                clean = False
                judged = " (listed as equivalent, but its diff changed: judge it again)" if name in EQUIVALENT else ""
                print(f"    survived: {name}{judged}")
        for name, status in sorted(statuses.items()):
            if status not in (*SCORED, "survived") and name not in equivalent:
                clean = False
                rerun = " (listed as equivalent, but its diff changed: run it with --rejudge and judge it again)" \
                    if name in EQUIVALENT else ""
                print(f"    {status}: {name}{rerun}")
        stale = sorted(name for name in EQUIVALENT if name.startswith(f"{_dotted(module)}.")
                       and statuses.get(name) not in ("survived", "no tests"))
        for name in stale:
            print(f"    listed as equivalent but {statuses.get(name, 'gone')}: {name} (update EQUIVALENT)")
    return clean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="files of [tool.mutmut].only_mutate")
    parser.add_argument("--tests", nargs="+", metavar="PATH", help="the tests to map and run (default: owners)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutant runs (default 1: 2 cores)")
    parser.add_argument("--survivors", action="store_true", help="run only the last run's survivors again")
    parser.add_argument("--report", action="store_true", help="print the last run's scores, run nothing")
    parser.add_argument("--rejudge", action="store_true", help="run the mutants judged equivalent too")
    args = parser.parse_args()
    if importlib.util.find_spec("mutmut") is None:
        parser.error("mutmut is not installed: pip install -e '.[mutation]'")
    configured = _configured_modules()
    unknown = sorted(set(args.modules) - set(configured))
    if unknown:
        parser.error(f"not in [tool.mutmut].only_mutate: {', '.join(unknown)}")
    modules = args.modules or configured
    os.chdir(REPO)  # mutmut works in the current directory (pyproject.toml, mutants/)
    # The fast suite: the vLLM tests skipped (pytest_add_cli_args deselects them too); the tiny model the
    # tests build is cached in the repository's .cache, not in the copy.
    os.environ["CORPUS_SKIP_VLLM"] = "1"
    os.environ.setdefault("CORPUS_TEST_CACHE", str(REPO / ".cache"))
    started = time.monotonic()
    if args.survivors:
        patterns = [name for module in modules for name, status in _statuses(module).items()
                    if status == "survived" and name not in EQUIVALENT]
        if not patterns:
            print("no survivors to run again")
    else:
        patterns = [pattern for module in modules for pattern in _patterns(module)]
    if patterns and not args.report:
        tests = args.tests or sorted({path for module in modules for path in OWNING_TESTS[module]})
        # Each module's mutants run its own owners only (tests/conftest.py reads this), whatever else the run maps.
        os.environ["CORPUS_MUTATION_OWNERS"] = json.dumps(
            {_dotted(module): args.tests or OWNING_TESTS[module] for module in modules})
        os.environ["CORPUS_MUTATION_JUDGED"] = json.dumps([] if args.rejudge else sorted(EQUIVALENT))
        _run(patterns, tests, args.max_children)
        print(f"\nmutmut run took {time.monotonic() - started:.0f} s")
    return 0 if _report(modules) else 1


if __name__ == "__main__":
    sys.exit(main())
