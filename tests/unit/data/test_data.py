"""Tests for interp.data: bundled records, official formats, our JSONL, hub row converters."""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
import types
from collections import Counter, OrderedDict
from pathlib import Path

import pytest

from interp import data as D
from interp.data import (
    DATASETS,
    HUB_IDS,
    DataError,
    QAExample,
    bundled_path,
    detect_format,
    drop_answer_text,
    example_from_hotpotqa,
    example_from_hub_row,
    example_from_ircot,
    example_from_musique,
    examples_from_drop,
    examples_from_squad_v2,
    load_examples,
    load_study_split,
    passage_key,
    round_robin,
    save_examples,
)

CORE = ("id", "dataset", "question", "context", "answerable")


def _bundled(dataset: str, split: str = "validation") -> list[dict]:
    with open(bundled_path(dataset, split), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _assert_same_core(ex: QAExample, rec: dict) -> None:
    for k in CORE:
        assert getattr(ex, k) == rec[k], (k, rec["id"])
    assert list(ex.answers) == rec["answers"], rec["id"]


# ----------------------------------------------------------------------------- bundled


@pytest.mark.parametrize(
    ("dataset", "split", "n_answerable", "n_total"),
    [
        ("squad_v2", "validation", 242, 500),
        ("squad_v2", "train", 250, 500),
        ("drop", "validation", 280, 280),
        ("hotpotqa", "validation", 585, 585),
        ("hotpotqa", "train", 100, 100),
        ("musique", "validation", 150, 150),
        ("musique", "train", 100, 100),
    ],
)
def test_bundled_counts(dataset, split, n_answerable, n_total):
    exs = load_examples(dataset, split=split)
    assert len(exs) == n_answerable
    assert all(ex.answerable and ex.answers for ex in exs)
    assert {ex.dataset for ex in exs} == {dataset}
    assert {ex.split for ex in exs} == {split}
    assert len({ex.id for ex in exs}) == len(exs)
    assert len(load_examples(dataset, split=split, include_unanswerable=True)) == n_total


def test_bundled_records_keep_extras_and_core_fields():
    recs = _bundled("drop")
    by_id = {ex.id: ex for ex in load_examples("drop")}
    assert set(by_id) == {r["id"] for r in recs}
    for rec in recs:
        ex = by_id[rec["id"]]
        _assert_same_core(ex, rec)
        assert ex.extras["primary_answer"] == rec["primary_answer"]
        assert ex.extras["passage_id"] == rec["passage_id"]
        assert ex.extras["raw"] == rec["raw"]
        assert ex.extras["source"]["repo"] == rec["source"]["repo"]
    hp = load_examples("hotpotqa", limit=3)
    assert all("type" in ex.extras and "level" in ex.extras for ex in hp)
    mq = load_examples("musique", limit=3)
    assert all(ex.extras["hops"] == ex.id.split("__")[0] for ex in mq)


def _rr_ids(recs: list[dict]) -> list[str]:
    """Round-robin order computed independently.

    Rank = (position within its passage, passage's first appearance).
    """
    first: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}
    keyed = []
    for r in recs:
        p = (r["dataset"], r["context"])
        first.setdefault(p, len(first))
        keyed.append(((seen.get(p, 0), first[p]), r["id"]))
        seen[p] = seen.get(p, 0) + 1
    return [i for _, i in sorted(keyed)]


def test_include_unanswerable_squad():
    recs = _bundled("squad_v2")
    allx = load_examples("squad_v2", include_unanswerable=True)
    assert [ex.id for ex in allx] == _rr_ids(recs)
    unans = [ex for ex in allx if not ex.answerable]
    assert len(unans) == 258
    assert all(ex.answers == () for ex in unans)
    answerable = [r for r in recs if r["answerable"]]
    assert [ex.id for ex in load_examples("squad_v2")] == _rr_ids(answerable)


def test_limit_takes_round_robin_prefix_after_filtering():
    full = load_examples("squad_v2")
    first = load_examples("squad_v2", limit=7)
    assert first == full[:7]
    assert all(ex.answerable for ex in first)
    assert load_examples("squad_v2", limit=7) == first  # deterministic
    assert load_examples("squad_v2", limit=0) == []
    assert len(load_examples("drop", limit=1000)) == 280
    mixed = load_examples("squad_v2", limit=5, include_unanswerable=True)
    assert [ex.id for ex in mixed] == _rr_ids(_bundled("squad_v2"))[:5]
    with pytest.raises(ValueError):
        load_examples("drop", limit=-1)
    with pytest.raises(DataError, match="non-negative int"):
        load_examples("drop", limit=2.5)


def test_round_robin_order_by_hand():
    """Passages A (a1 a2 a3), B (b1), C (c1 c2) in file order -> a1 b1 c1 a2 c2 a3."""
    ctx = {"a": "Passage A.", "b": "Passage B.", "c": "Passage C."}
    order = ["a1", "a2", "a3", "b1", "c1", "c2"]
    exs = [QAExample(i, "toy", ctx[i[0]], f"q {i}?", ["x"]) for i in order]
    ids = [ex.id for ex in round_robin(exs)]
    assert ids == ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert [ex.id for ex in round_robin(exs, 4)] == ["a1", "b1", "c1", "a2"]
    assert round_robin(exs, 0) == [] and len(round_robin(exs, 99)) == 6
    assert round_robin(round_robin(exs)) == round_robin(exs)  # idempotent
    # the same passage text in another dataset is another passage
    other = QAExample("z1", "toy2", ctx["a"], "q?", ["x"])
    assert passage_key(other) != passage_key(exs[0])
    assert passage_key(exs[0]) == passage_key({"dataset": "toy", "context": "Passage A."})
    assert passage_key(exs[0]) == "toy:" + hashlib.sha1(b"Passage A.").hexdigest()[:12]
    with pytest.raises(DataError):
        round_robin(exs, -1)


def test_drop_limit_spreads_over_passages():
    """The first 50 DROP records of the file come from 3 passages; a limit-50 sample from 19."""
    recs = _bundled("drop")
    assert len({r["passage_id"] for r in recs[:50]}) == 3
    sample = load_examples("drop", limit=50)
    per_passage = Counter(ex.extras["passage_id"] for ex in sample)
    assert len(per_passage) == 19
    assert sorted(per_passage.values()) == [2] * 7 + [3] * 12
    first19 = [ex.extras["passage_id"] for ex in sample[:19]]
    assert first19 == list(dict.fromkeys(r["passage_id"] for r in recs))  # one per passage
    # a smaller limit is a prefix of a larger one (a run extended with --limit keeps records)
    assert load_examples("drop", limit=20) == sample[:20]


@pytest.mark.parametrize(("dataset", "n_passages"),
                         [("squad_v2", 50), ("drop", 19), ("hotpotqa", 50), ("musique", 50)])
def test_every_dataset_limit_is_round_robin(dataset, n_passages):
    sample = load_examples(dataset, limit=50)
    assert len(sample) == 50
    assert len({passage_key(ex) for ex in sample}) == n_passages
    full = [QAExample.from_dict(r) for r in _bundled(dataset) if r["answerable"]]
    assert sample == round_robin(full, 50)


def test_jsonl_without_dataset_uses_file_stem(tmp_path):
    p = tmp_path / "my_qa.jsonl"
    lines = [
        {"id": 1, "question": "Who?", "context": "Ann met Bob.", "answers": ["Ann"]},
        {"id": "2", "question": "Whom?", "context": "Ann met Bob.", "answers": ["Bob"],
         "split": "train", "note": "kept"},
        {"id": "3", "dataset": "drop", "question": "How many?", "context": "Two.",
         "answers": ["2"]},
    ]
    _write_lines(p, [json.dumps(r) for r in lines])
    exs = {ex.id: ex for ex in load_examples(p)}
    assert [exs[i].dataset for i in ("1", "2", "3")] == ["my_qa", "my_qa", "drop"]
    assert [exs[i].split for i in ("1", "2", "3")] == ["validation", "train", "validation"]
    assert exs["2"].extras == {"note": "kept"} and exs["1"].answerable
    one = tmp_path / "single.json"
    one.write_text(json.dumps(lines[0], indent=2), encoding="utf-8")
    assert load_examples(one)[0].dataset == "single"
    with pytest.raises(DataError) as ei:
        QAExample.from_dict(lines[0])  # no file, no default: dataset is required
    assert ei.value.field == "dataset"


def test_public_names_used_elsewhere_import_from_interp_data():
    """Every name other modules import from interp.data (grep of the repo) still resolves."""
    import interp.data as package

    used = {"QAExample", "load_examples", "DATASETS", "DataError", "bundled_path",
            "bundled_splits", "detect_format", "drop_answer_text", "example_from_hotpotqa",
            "example_from_hub_row", "example_from_ircot", "example_from_musique",
            "examples_from_drop", "examples_from_squad_v2", "save_examples", "HUB_IDS",
            "BUNDLED_DIR", "passage_key", "round_robin"}
    assert used <= set(package.__all__)
    assert all(getattr(package, n) is not None for n in used)
    assert package.BUNDLED_DIR.name == "bundled" and package.BUNDLED_DIR.is_dir()
    for mod in ("examples", "formats", "loading", "__init__"):
        path = Path(package.__file__).with_name(f"{mod}.py")
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 600, mod


def test_split_alias_and_missing_drop_train():
    assert load_examples("musique", split="dev", limit=2) == load_examples("musique", limit=2)
    with pytest.raises(DataError) as ei:
        load_examples("drop", split="train")
    msg = str(ei.value)
    assert "'train'" in msg and "'drop'" in msg and "validation" in msg
    assert "from_hub" in msg


def test_unknown_dataset_lists_names_and_mentions_paths():
    with pytest.raises(DataError) as ei:
        load_examples("squad3")
    msg = str(ei.value)
    for name in DATASETS:
        assert name in msg
    assert "path" in msg
    assert isinstance(ei.value, ValueError)


def test_missing_file_path(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_examples(tmp_path / "nope.jsonl")


# ----------------------------------------------------------------------------- our JSONL


def test_save_load_roundtrip(tmp_path):
    exs = load_examples("squad_v2", include_unanswerable=True, limit=20)
    exs += load_examples("hotpotqa", limit=5) + load_examples("drop", limit=5)
    out = save_examples(exs, tmp_path / "sub" / "ours.jsonl")
    back = load_examples(out, include_unanswerable=True)
    assert back == exs
    first = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert list(first) == ["id", "dataset", "split", "question", "context", "answers",
                           "answerable", "extras"]
    assert detect_format(out) == "jsonl"


def test_study_split_of_a_file_is_disjoint_by_passage(tmp_path):
    """One file for train and validation: its passages dealt out in turn, none on both sides."""
    exs = load_examples("drop", limit=30)  # DROP: several questions a passage
    out = save_examples(exs, tmp_path / "drop.jsonl")
    val, train = load_study_split(out, "validation"), load_study_split(out, "train")
    keys = lambda side: {passage_key(e) for e in side}  # noqa: E731
    assert keys(val) & keys(train) == set()
    assert sorted(e.id for e in val + train) == sorted(e.id for e in exs)
    first = list(dict.fromkeys(passage_key(e) for e in exs))
    assert keys(val) == set(first[0::2]) and keys(train) == set(first[1::2])
    assert load_study_split(out, "dev", limit=3) == val[:3]
    # a named dataset keeps its own splits
    assert load_study_split("squad_v2", "train", limit=4) == load_examples(
        "squad_v2", split="train", limit=4)
    with pytest.raises(DataError, match="'train' or 'validation'"):
        load_study_split(out, "test")


def test_from_dict_accepts_top_level_and_nested_extras():
    base = {"id": "q1", "dataset": "x", "question": "Q?", "context": "C.", "answers": ["a"]}
    a = QAExample.from_dict({**base, "hops": "2hop", "extras": {"k": 1}})
    assert a.extras == {"hops": "2hop", "k": 1}
    assert a.answerable is True and a.split == "validation"
    b = QAExample.from_dict({**base, "extras": {"hops": "2hop", "k": 1}}, split="train")
    assert b.extras == a.extras and b.split == "train"
    assert QAExample.from_dict(a.to_dict()) == a
    c = QAExample.from_dict({**base, "answers": [], "answerable": False})
    assert c.answers == () and not c.answerable
    assert json.loads(json.dumps(a.to_dict())) == a.to_dict()


def test_qaexample_validation_and_pickle():
    ex = QAExample("i", "d", "ctx", "q?", ["a", "b"])
    assert ex.answers == ("a", "b")
    assert hash(ex) == hash(QAExample("i", "d", "ctx", "q?", ("a", "b"), extras={"z": 1}))
    assert pickle.loads(pickle.dumps(ex)) == ex
    with pytest.raises(DataError, match="answers"):
        QAExample("i", "d", "ctx", "q?", "a")
    with pytest.raises(DataError, match="answers"):
        QAExample("i", "d", "ctx", "q?", ["a", 3])
    with pytest.raises(DataError, match="'id'"):
        QAExample("", "d", "ctx", "q?", ["a"])
    with pytest.raises(DataError, match="'context'"):
        QAExample("i", "d", "  ", "q?", ["a"])
    with pytest.raises(DataError, match="answerable"):
        QAExample("i", "d", "ctx", "q?", [])
    with pytest.raises(AttributeError):
        ex.id = "other"  # frozen


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_malformed_line_names_file_and_line(tmp_path):
    recs = _bundled("musique")[:2]
    lines = [json.dumps(r) for r in recs]
    lines.insert(1, "")  # blank lines are skipped but still counted
    lines.append('{"id": "x", "question": ')
    p = _write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DataError) as ei:
        load_examples(p)
    assert f"{p}:4" in str(ei.value)
    assert "malformed" in str(ei.value)


@pytest.mark.parametrize("missing", ["question", "context", "id", "answers"])
def test_missing_field_names_field_and_line(tmp_path, missing):
    recs = [r for r in _bundled("drop")[:3]]
    del recs[1][missing]
    p = _write_lines(tmp_path / "missing.jsonl", [json.dumps(r) for r in recs])
    with pytest.raises(DataError) as ei:
        load_examples(p)
    assert ei.value.field == missing
    assert repr(missing) in str(ei.value)
    assert f"{p}:2" in str(ei.value)


def test_missing_field_in_official_squad_json(tmp_path):
    raw = _bundled("squad_v2")[0]["raw"]
    qa = {k: v for k, v in raw.items() if k not in ("title", "context", "question")}
    obj = {"data": [{"title": "T", "paragraphs": [{"context": raw["context"], "qas": [qa]}]}]}
    p = tmp_path / "squad.json"
    p.write_text(json.dumps(obj), encoding="utf-8")
    with pytest.raises(DataError) as ei:
        load_examples(p, include_unanswerable=True)
    assert ei.value.field == "question"
    assert str(p) in str(ei.value) and "qas[0]" in str(ei.value)


# ----------------------------------------------------------------------------- official formats


def _squad_json(recs: list[dict]) -> dict:
    """Rebuild an official SQuAD v2.0 json from bundled records' ``raw``."""
    articles: OrderedDict[str, OrderedDict[str, list]] = OrderedDict()
    for r in recs:
        raw = r["raw"]
        paras = articles.setdefault(raw["title"], OrderedDict())
        qa = {k: v for k, v in raw.items() if k not in ("title", "context")}
        paras.setdefault(raw["context"], []).append(qa)
    return {
        "version": "v2.0",
        "data": [
            {"title": t, "paragraphs": [{"context": c, "qas": q} for c, q in ps.items()]}
            for t, ps in articles.items()
        ],
    }


def _drop_json(recs: list[dict]) -> dict:
    """Rebuild an official DROP json (passage_id -> passage entry) from bundled records."""
    out: dict[str, dict] = {}
    for r in recs:
        raw = r["raw"]
        new = {"passage": r["context"], "qa_pairs": [], "wiki_url": raw["wiki_url"]}
        entry = out.setdefault(raw["passage_id"], new)
        entry["qa_pairs"].append(
            {k: v for k, v in raw.items() if k not in ("passage_id", "wiki_url")}
        )
    return out


@pytest.mark.parametrize("split", ["validation", "train"])
def test_squad_official_json_roundtrip(tmp_path, split):
    recs = _bundled("squad_v2", split)[:40]
    # Indented, with a misleading extension: the format is detected from the content.
    p = tmp_path / "squad_fixture.txt"
    p.write_text(json.dumps(_squad_json(recs), indent=2), encoding="utf-8")
    assert detect_format(p) == "squad_v2_json"
    exs = load_examples(p, split=split, include_unanswerable=True)
    by_id = {ex.id: ex for ex in exs}
    assert set(by_id) == {r["id"] for r in recs}
    for r in recs:
        _assert_same_core(by_id[r["id"]], r)
        assert by_id[r["id"]].split == split
        assert by_id[r["id"]].extras["paragraph_key"].startswith(r["raw"]["title"] + "#")
    assert len(load_examples(p)) == sum(r["answerable"] for r in recs)


def test_drop_official_json_roundtrip(tmp_path):
    recs = _bundled("drop")
    p = tmp_path / "drop_dev.json"
    p.write_text(json.dumps(_drop_json(recs), indent=4), encoding="utf-8")
    assert detect_format(p) == "drop_json"
    exs = load_examples(p)
    assert [ex.id for ex in exs] == _rr_ids(recs)
    by_id = {ex.id: ex for ex in exs}
    for r in recs:
        ex = by_id[r["id"]]
        _assert_same_core(ex, r)
        for k in ("primary_answer", "answer_type", "answer_spans", "answer_date", "passage_id"):
            assert ex.extras[k] == r[k], (k, r["id"])


def test_hotpotqa_official_json_roundtrip(tmp_path):
    recs = [r for r in _bundled("hotpotqa") if "original" in r["raw_format"]][:15]
    recs += _bundled("hotpotqa", "train")[:5]
    p = tmp_path / "hotpot_dev_distractor_v1.json"
    p.write_text(json.dumps([r["raw"] for r in recs]), encoding="utf-8")
    assert detect_format(p) == "hotpotqa_json"
    exs = load_examples(p)
    assert len(exs) == len(recs)
    for ex, r in zip(exs, recs):
        _assert_same_core(ex, r)
        assert ex.extras["type"] == r["type"] and ex.extras["level"] == r["level"]
        assert ex.extras["supporting_titles"]


def test_hotpotqa_ircot_jsonl_roundtrip(tmp_path):
    recs = [r for r in _bundled("hotpotqa") if r["raw_format"].startswith("IRCoT")][:15]
    p = _write_lines(tmp_path / "dev_subsampled.jsonl", [json.dumps(r["raw"]) for r in recs])
    assert detect_format(p) == "ircot_jsonl"
    exs = load_examples(p)
    for ex, r in zip(exs, recs, strict=True):
        _assert_same_core(ex, r)
        assert ex.extras["type"] is None and ex.extras["level"] is None


@pytest.mark.parametrize("split", ["validation", "train"])
def test_musique_official_jsonl_roundtrip(tmp_path, split):
    recs = _bundled("musique", split)[:20]
    p = _write_lines(tmp_path / "musique.data", [json.dumps(r["raw"]) for r in recs])
    assert detect_format(p) == "musique_jsonl"
    exs = load_examples(p, split=split)
    for ex, r in zip(exs, recs, strict=True):
        _assert_same_core(ex, r)
        assert ex.split == split
        assert ex.extras["hops"] == r["hops"]
        n_sup = sum(par["is_supporting"] for par in r["raw"]["paragraphs"])
        assert len(ex.extras["supporting_titles"]) == n_sup


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_bundled_record_reproduces_from_raw(dataset):
    """Each bundled record's context/question/answers follow from its ``raw`` field."""
    for split in D.bundled_splits(dataset):
        for r in _bundled(dataset, split):
            raw = r["raw"]
            if dataset == "squad_v2":
                ex = examples_from_squad_v2(_squad_json([r]), split=split)[0]
            elif dataset == "drop":
                ex = examples_from_drop(_drop_json([r]), split=split)[0]
            elif dataset == "hotpotqa":
                conv = example_from_ircot if "question_text" in raw else example_from_hotpotqa
                ex = conv(raw, split=split)
            else:
                ex = example_from_musique(raw, split=split)
            _assert_same_core(ex, r)


def test_drop_answer_text_forms():
    empty_date = {"day": "", "month": "", "year": ""}
    assert drop_answer_text({"number": "12", "date": empty_date, "spans": []}) == ("12", "number")
    assert drop_answer_text({"number": "", "date": empty_date, "spans": ["a", "b"]}) == (
        "a, b",
        "spans",
    )
    date = {"day": "5", "month": "June", "year": "1944"}
    assert drop_answer_text({"number": "", "date": date, "spans": []}) == ("5 June 1944", "date")
    ans = {"number": "", "date": date, "spans": []}
    assert drop_answer_text(ans, "on June 5, 1944 the")[0] == "June 5, 1944"
    year = {"day": "", "month": "", "year": "1085"}
    assert drop_answer_text({"number": "", "date": year, "spans": []}) == ("1085", "date")
    assert drop_answer_text({"number": "", "date": empty_date, "spans": []}) == ("", None)


def test_single_record_json_and_json_list_of_ours(tmp_path):
    exs = load_examples("musique", limit=2)
    one = tmp_path / "one.json"
    one.write_text(json.dumps(exs[0].to_dict(), indent=2), encoding="utf-8")
    assert load_examples(one) == exs[:1]
    many = tmp_path / "many.json"
    many.write_text(json.dumps([e.to_dict() for e in exs], indent=2), encoding="utf-8")
    assert load_examples(many) == exs


def test_malformed_whole_json_reports_line(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{\n  "data": [\n    {"title": "x",,}\n  ]\n}\n', encoding="utf-8")
    with pytest.raises(DataError) as ei:
        load_examples(p)
    assert f"{p}:3" in str(ei.value)


# ----------------------------------------------------------------------------- hub rows


def test_hub_row_squad_v2():
    row = {"id": "56de", "title": "Normans", "context": "The Normans were in France.",
           "question": "Where?",
           "answers": {"text": ["France", "France"], "answer_start": [20, 20]}}
    ex = example_from_hub_row("squad_v2", row, split="validation")
    assert ex.answers == ("France",) and ex.answerable
    assert ex.context[ex.extras["answer_starts"][0]:].startswith("France")
    unans = dict(row, answers={"text": [], "answer_start": []})
    ex2 = example_from_hub_row("squad_v2", unans, split="train")
    assert not ex2.answerable and ex2.answers == () and ex2.split == "train"


def test_hub_row_drop():
    row = {"section_id": "nfl_995", "query_id": "5b6a", "passage": " P.", "question": "Who?",
           "answers_spans": {"spans": ["T. J. Houshmandzadeh", "Houshmandzadeh"],
                             "types": ["span", "span"]}}
    ex = example_from_hub_row("drop", row, split="validation")
    assert ex.id == "5b6a" and ex.context == " P."
    assert ex.answers == ("T. J. Houshmandzadeh", "Houshmandzadeh")
    assert ex.extras["primary_answer"] == "T. J. Houshmandzadeh"
    assert ex.extras["answer_type"] == "spans" and ex.extras["passage_id"] == "nfl_995"
    num = dict(row, answers_spans={"spans": ["3"], "types": ["number"]})
    assert example_from_hub_row("drop", num, split="validation").extras["answer_type"] == "number"


def test_hub_row_hotpotqa_matches_official_converter():
    rec = next(r for r in _bundled("hotpotqa") if "original" in r["raw_format"])
    raw = rec["raw"]
    titles = [t for t, _ in raw["context"]]
    row = {
        "id": raw["_id"], "question": raw["question"], "answer": raw["answer"],
        "type": raw["type"], "level": raw["level"],
        "supporting_facts": {"title": [t for t, _ in raw["supporting_facts"]],
                             "sent_id": [i for _, i in raw["supporting_facts"]]},
        "context": {"title": titles, "sentences": [s for _, s in raw["context"]]},
    }
    ex = example_from_hub_row("hotpotqa", row, split="validation")
    _assert_same_core(ex, rec)
    assert ex.extras["supporting_facts"] == [list(sf) for sf in raw["supporting_facts"]]


def test_hub_row_musique():
    rec = _bundled("musique")[0]
    ex = example_from_hub_row("musique", rec["raw"], split="validation")
    _assert_same_core(ex, rec)
    with pytest.raises(DataError, match="unknown dataset"):
        example_from_hub_row("nq", {}, split="validation")
    with pytest.raises(DataError) as ei:
        example_from_hub_row("musique", {"id": "2hop__1_2", "question": "q"}, split="train")
    assert ei.value.field == "answer"


def test_from_hub_uses_hub_ids_with_fake_datasets(monkeypatch):
    calls = []
    rows = [
        {"id": "a", "title": "T", "context": "ctx a", "question": "q1?",
         "answers": {"text": [], "answer_start": []}},
        {"id": "b", "title": "T", "context": "ctx b", "question": "q2?",
         "answers": {"text": ["x"], "answer_start": [0]}},
        {"id": "c", "title": "T", "context": "ctx c", "question": "q3?",
         "answers": {"text": ["y"], "answer_start": [0]}},
    ]

    def load_dataset(*args, split):
        calls.append((args, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    exs = load_examples("squad_v2", from_hub=True, limit=1, split="dev")
    assert [ex.id for ex in exs] == ["b"]
    assert calls == [(("rajpurkar/squad_v2",), "validation")]
    rows = []
    assert load_examples("hotpotqa", from_hub=True, split="train") == []
    assert calls[-1] == (("hotpotqa/hotpot_qa", "distractor"), "train")

    def failing(*args, split):
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=failing))
    with pytest.raises(DataError, match="ucinlp/drop"):
        load_examples("drop", from_hub=True)
    with pytest.raises(DataError, match="dataset name"):
        load_examples("some/file.jsonl", from_hub=True)


def test_hub_ids_cover_all_datasets():
    assert set(HUB_IDS) == set(DATASETS)
    assert HUB_IDS["hotpotqa"] == ("hotpotqa/hotpot_qa", "distractor")
