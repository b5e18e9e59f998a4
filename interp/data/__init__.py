r"""Loading in-context QA examples: SQuAD 2.0, DROP, HotpotQA, MuSiQue, and your own files.

Every loader returns :class:`QAExample` objects: one question, one context string and every
gold answer string. Examples come from three kinds of source:

* **Bundled records** (``interp/bundled/<dataset>/<split>.jsonl``, described in
  ``interp/bundled/SOURCES.md``): small, pinned samples of the real datasets that work
  offline. ``load_examples("squad_v2")`` reads one of them.
* **Files** in our JSONL format (below) or in the datasets' official formats (SQuAD v2.0 json,
  DROP json, HotpotQA json, MuSiQue jsonl, and IRCoT's processed jsonl). The format is
  detected from the content, not from the file name.
* **The Hugging Face Hub** (``from_hub=True``), through ``datasets.load_dataset`` with the
  ids in :data:`HUB_IDS`.

Our JSONL format (written by :func:`save_examples`, read by :func:`load_examples`): UTF-8, one
JSON object per line, blank lines skipped. Fields:

=============== ============ ========= ======================================================
field           type         required  meaning
=============== ============ ========= ======================================================
``id``          str (or int) yes       unique id of the question (ints become strings)
``question``    str          yes       the question, non-empty
``context``     str          yes       the passage the model must answer from, non-empty
``answers``     list of str  yes       every gold answer; ``[]`` only when unanswerable
``dataset``     str          no        dataset name; default: the file's stem
                                       (``my_qa.jsonl`` -> ``"my_qa"``). ``"drop"`` selects
                                       DROP's grading rules, any other name the extractive
                                       ones (:class:`interp.judging.grading.RuleOracle`)
``answerable``  bool         no        default: ``answers`` is non-empty
``split``       str          no        default: the ``split`` argument of the loader
``extras``      object       no        anything else, JSON-serialisable (DROP:
                                       ``answer_spans``, ``passage_id``, ...)
=============== ============ ========= ======================================================

Any other top-level key (as in the bundled files: ``source``, ``raw_format``, ``raw``,
``paragraph_key``, ``type``, ...) is also put into ``extras``. A missing required field or a
malformed line is a :class:`~interp.core.errors.DataError` naming ``path:line`` and the field.

Context strings are built the same way for every source, exactly as ``SOURCES.md`` says:

* SQuAD and DROP: the paragraph or passage as is (SQuAD ``answer_start`` offsets still work).
* HotpotQA: one ``"Title: " + "".join(sentences)`` block per paragraph (the original
  sentences carry their own leading spaces), blocks joined by a blank line (``"\n\n"``).
* MuSiQue and IRCoT-format records: one ``"Title: paragraph_text"`` block per paragraph,
  joined by a blank line.
* In these multi-paragraph formats each paragraph's text is stripped of leading and
  trailing whitespace, as in the bundled records (this matters for a handful of paragraphs).

Answers are every gold string, duplicates removed in order:

* SQuAD: every annotator answer; ``[]`` for unanswerable SQuAD 2.0 questions.
* DROP: the original ``answer`` first, then each ``validated_answers`` entry. A number gives
  its string, a multi-span answer its spans joined with ``", "``, and a date the form in which
  it occurs in the passage (``Month D, YYYY``, ``D Month YYYY``, ...) or else
  ``"day month year"`` with empty parts left out.
* HotpotQA: ``answer``. MuSiQue: ``answer`` followed by ``answer_aliases``.

Sampling (``limit``): files are often ordered by passage (the official DROP and SQuAD files
list every question of a passage together), so the first N records can come from very few
passages (the first 50 DROP records of the file come from 3). :func:`load_examples` therefore
returns examples **round-robin across passages** (:func:`round_robin`), with or without a
``limit``: the first question of each passage in order of first appearance, then the second
question of each, and so on; ``limit=N`` keeps the first N of that order. A passage is the
pair (dataset, context string), :func:`passage_key`. The order is deterministic (no seed), a
sample with a smaller limit is a prefix of one with a larger limit (a run extended with a
larger ``--limit`` keeps its earlier records), and a run's records, written in this order,
stay passage-balanced when a later stage takes the first N per dataset.

Modules: :mod:`interp.data.examples` (:class:`QAExample`), :mod:`interp.data.formats`
(official-format and Hub converters), :mod:`interp.data.loading` (files, bundled records, the
Hub, :func:`load_examples`).
"""

from __future__ import annotations

from interp.core.errors import DataError
from interp.data import formats, loading
from interp.data.examples import DATASETS, QAExample
from interp.data.formats import *  # noqa: F403 - the package's API is its modules' __all__
from interp.data.loading import *  # noqa: F403

__all__ = ["DATASETS", "DataError", "QAExample", *formats.__all__, *loading.__all__]
