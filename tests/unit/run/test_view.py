"""``interp view``: the page's content, and the page in a real headless Chromium.

The browser test needs the Debian package ``chromium`` (CI installs it); without it, it is
skipped and says so. It prints the path of the screenshot it takes.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from interp.core.errors import LayerSpecError, RunDirError
from interp.hooks.recorder import record_rows
from interp.judging.prompts import get_template, render
from interp.run.view import find_record, page_data, render_page, write_view
from interp.stages import record as record_stage
from interp.testing import synthetic_probe_run
from tests import chromium


@pytest.fixture()
def view_run(tiny, tmp_path):
    run = synthetic_probe_run(tmp_path / "run", tiny, n_good=2, n_bad=1)
    recs = run.read_records()
    recs[0]["logit_diff"], recs[0]["verdict_coverage"] = -1.25, 0.875
    run.records_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def _data(html: str) -> dict:
    blob = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    return json.loads(blob.group(1))


def test_page_is_self_contained_and_carries_exact_rows(tiny, view_run, tmp_path):
    path = write_view(view_run, tiny, "ex0", tmp_path / "p.html", band="all")
    html = path.read_text()
    assert not re.search(r"(src|href)=|https?://|@import|url\(", html)  # nothing fetched
    for shown in ("logit_diff", "-1.25", "verdict_coverage", "0.875", "oracle_label",
                  "Correct", "Which city is in fact 0?"):
        assert shown in html
    data = _data(html)
    rec = find_record(view_run, "ex0")
    for task in ("gen", "eval"):
        t = data["tasks"][task]
        rows = np.frombuffer(base64.b64decode(t["rows"]), dtype="<f4")
        from interp.judging.prompts import record_prompts
        p = record_prompts(rec, tiny.tokenizer)[task]
        want = record_rows(tiny, p.input_ids).rows.numpy()
        assert np.array_equal(rows.reshape(want.shape), want)
        assert t["labels"] == p.labels and len(t["tokens"]) == len(p)
    assert data["band"] == [0, 1] and (data["n_layers"], data["n_heads"]) == (2, 4)
    # a "</script>" inside a record cannot end the data block early
    page = render_page({**data, "question": "x</script><b>", "fields": {"answer": "</script>"}})
    assert page.count("</script>") == 2 and "x&lt;/script&gt;" in page


def test_view_refuses_bad_input(tiny, view_run):
    with pytest.raises(RunDirError, match="no ok record"):
        write_view(view_run, tiny, "missing", band="all")
    with pytest.raises(LayerSpecError):
        write_view(view_run, tiny, "ex0", band="last4")  # the tiny model has 2 layers
    with pytest.raises(RunDirError, match="labels"):
        page_data({"id": "a", "dataset": "d"}, {"gen": ["a"], "eval": ["a"]},
                  {"gen": ["x"], "eval": []}, {"gen": np.ones((1, 1, 1)),
                                               "eval": np.ones((1, 1, 1))}, [0])


def test_default_path_and_record_stage_are_independent(tiny, view_run):
    path = write_view(view_run, tiny, "ex1", band="1")
    assert path == view_run.path / "view" / "squad_v2" / "ex1.html"
    assert not (view_run.path / record_stage.SPEC.folder).exists()  # no `interp record` needed


_COLOURS = "Array.from(document.querySelectorAll('#text-eval .tok, #text-gen .tok'))" \
           ".map(s => s.style.backgroundColor)"


def _pick(select: str, value: str) -> str:
    return (f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}'; "
            f"s.dispatchEvent(new Event('change')); return s.value; }})()")


@pytest.mark.skipif(not chromium.available(), reason=chromium.MISSING)
def test_page_in_headless_chromium(tiny, view_run, tmp_path):
    path = write_view(view_run, tiny, "ex0", tmp_path / "view.html", band="all")
    with chromium.Chromium() as c:
        c.open(path)
        n_tok = c.evaluate("document.querySelectorAll('.tok').length")
        data = _data(path.read_text())
        assert n_tok == sum(len(t["tokens"]) for t in data["tasks"].values())
        assert c.evaluate("document.querySelectorAll('#head option').length") == 4 + 1
        assert c.evaluate("document.querySelectorAll('#layer option').length") == 2 + 1
        assert c.evaluate("document.querySelectorAll('.seg.s-candidate').length") == 1
        band_mean = c.evaluate(_COLOURS)
        assert c.evaluate(_pick("head", "0")) == "0"
        head0 = c.evaluate(_COLOURS)
        assert c.evaluate(_pick("head", "3")) == "3"
        head3 = c.evaluate(_COLOURS)
        c.evaluate(_pick("layer", "1"))
        layer1 = c.evaluate(_COLOURS)
        changed = sum(a != b for a, b in zip(head0, head3))
        assert changed > n_tok // 2, f"switching the head changed {changed}/{n_tok} colours"
        assert head0 != band_mean and layer1 != head3
        assert all(re.fullmatch(r"rgba\(214, 39, 40, [0-9.]+\)|rgb\(214, 39, 40\)", x)
                   for x in head3)
        masses = c.evaluate("document.getElementById('mass-eval').textContent")
        assert masses.startswith("span mass: context") and "candidate" in masses
        shot = c.screenshot(tmp_path / "view.png")
        assert c.errors == [], c.errors
    assert shot.stat().st_size > 10_000
    print(f"\nscreenshot of the view page: {shot}")


@pytest.mark.skipif(not chromium.available(), reason=chromium.MISSING)
def test_chromium_helper_reports_console_errors_and_exceptions(tmp_path):
    """The check above can fail: a page that logs an error and throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('broken', 1); null.x;</script></body>"
                   "</html>")
    with chromium.Chromium() as c:
        c.open(bad)
        assert c.evaluate("1 + 1") == 2
    assert any(e.startswith("console: broken") for e in c.errors), c.errors
    assert any(e.startswith("exception: TypeError") for e in c.errors), c.errors


EMOJI_CJK = "The tower 🗼 stands in 東京 (Tōkyō) 👩‍👩‍👧; café ☕ opens at 9."


def test_token_strings_show_each_multibyte_character_once(tiny):
    """Byte-level BPE splits emoji and CJK characters over several tokens."""
    from interp.core.tokens import PIECE, token_strings

    tok = tiny.tokenizer
    ids = tok(EMOJI_CJK, add_special_tokens=False)["input_ids"]
    alone = [tok.decode([i]) for i in ids]
    assert sum("\ufffd" in s for s in alone) >= 10               # the fault: U+FFFD pieces
    shown = token_strings(tok, ids)
    assert len(shown) == len(ids) and "".join(shown) == EMOJI_CJK == tok.decode(ids)
    assert not any("\ufffd" in s for s in shown)
    assert shown.count(PIECE) >= 10
    for ch in ("🗼", "東", "京", "☕", "👩"):                       # each once, where it completes
        assert sum(ch in s for s in shown) == EMOJI_CJK.count(ch)


def test_viewer_shows_emoji_context_without_replacement_characters(tiny, view_run, tmp_path):
    recs = view_run.read_records()
    r = recs[0]
    tpl = get_template("default")
    r["context"] = EMOJI_CJK
    r["prompts"] = {t: render(tiny.tokenizer, tpl, t, context=EMOJI_CJK, question=r["question"],
                              answer=r["answer"], reference=r["answer"]).to_record()
                    for t in ("gen", "eval")}
    view_run.records_path.write_text("".join(json.dumps(x) + "\n" for x in recs))
    data = _data(write_view(view_run, tiny, "ex0", tmp_path / "e.html", band="all").read_text())
    for task in ("gen", "eval"):
        toks = data["tasks"][task]["tokens"]
        assert not any("\ufffd" in s for s in toks) and EMOJI_CJK in "".join(toks)
        assert "" in toks                                         # the marked byte pieces
