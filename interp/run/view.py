"""``interp view``: one record's last-token attention as a self-contained HTML page.

Algorithm of :func:`write_view`:

1. Find the record (``--id``, and ``--dataset`` when the id occurs in several datasets) among
   the run's ``ok`` records; re-render its gen and eval prompts and check them
   (:func:`interp.judging.prompts.record_prompts`); check the model is the run's.
2. One forward per prompt with :func:`interp.hooks.recorder.record_rows`: the last-token
   attention row of every layer and query head ``[n_layers, n_heads, pos]`` (the answer
   position of the gen prompt, the verdict position of the eval prompt). No ``interp record``
   is needed: these rows are small.
3. :func:`render_page` writes ONE HTML file with everything inline (no server, no network, no
   external script, style or font): the record's question, answer, gold answers, oracle label,
   verdict, ``logit_diff``, ``p_correct`` and ``verdict_coverage`` (when the record has them)
   on top; the gen and eval prompts side by side, every token coloured by the attention the
   last position pays it, spans (context, question, candidate, template, ...) boxed and
   labelled, the mass of each span listed; pickers for the layer (or the band mean), the head
   (or the mean over heads) and the colour scale. The rows travel as base64 float32 (exact);
   about 80 lines of inline JavaScript average and colour them.

Why not circuitsvis (checked: 1.43.3, the newest on PyPI, installs offline with torch 2.13):
its widgets cannot share one layer/head picker between two prompts or mark spans, each
widget inlines its 1.3 MB React bundle, and its notebook display pings a public host before
choosing between inline and CDN JavaScript; its last release is from 2024-12.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

from interp.analysis.span_mass import TASKS
from interp.core.errors import RunDirError
from interp.core.io import atomic_write_text
from interp.core.layers import DEFAULT_BAND, parse_layers
from interp.core.names import safe_name
from interp.core.tokens import token_strings
from interp.hooks.recorder import record_rows
from interp.judging.prompts import record_prompts
from interp.models.loading import ModelHandle
from interp.stages.common import check_run_model
from interp.store.records import Record
from interp.store.rundir import RunDir

__all__ = ["find_record", "page_data", "render_page", "write_view"]

HEADER_FIELDS = ("answer", "oracle_label", "verdict", "verdict_text", "logit_diff", "p_correct",
                 "verdict_coverage")
"""Record fields shown on top of the page (in this order, those the record has)."""


def find_record(run: RunDir, record_id: str, dataset: str | None = None) -> Record:
    """The ``ok`` record with ``id`` (and ``dataset``).

    Raises:
        RunDirError: no such record, or the id occurs in several datasets (pass ``dataset``).
    """
    hits = [r for r in run.read_records() if str(r["id"]) == str(record_id)
            and (dataset is None or r["dataset"] == dataset)]
    if not hits:
        raise RunDirError(f"{run.path} has no ok record with id {record_id!r}"
                          f"{'' if dataset is None else f' in {dataset}'}")
    if len(hits) > 1:
        raise RunDirError(f"id {record_id!r} occurs in {sorted(r['dataset'] for r in hits)}: "
                          f"pass --dataset")
    return hits[0]


def page_data(record: Mapping[str, Any], tokens: Mapping[str, Sequence[str]],
              labels: Mapping[str, Sequence[str]],
              rows: Mapping[str, Float[np.ndarray, "layer head pos"]], band: Sequence[int],
              model: str = "") -> dict[str, Any]:
    """What the page shows, as JSON-able data (rows as base64 float32, little-endian).

    Args:
        record: the run's record (header fields, :data:`HEADER_FIELDS`).
        tokens: task -> token strings ``[pos]``.
        labels: task -> span label of every position ``[pos]``.
        rows: task -> last-token attention ``[n_layers, n_heads, pos]``.
        band: the layers of the "band mean" choice.
        model: the model spec shown on top.

    Raises:
        RunDirError: tokens, labels and rows disagree in length.
    """
    tasks = {}
    for t in TASKS:
        r = np.asarray(rows[t], dtype="<f4")
        if not len(tokens[t]) == len(labels[t]) == r.shape[-1]:
            raise RunDirError(f"{t}: {len(tokens[t])} tokens, {len(labels[t])} labels, rows "
                              f"over {r.shape[-1]} positions")
        tasks[t] = {"tokens": list(tokens[t]), "labels": list(labels[t]),
                    "rows": base64.b64encode(r.tobytes()).decode()}
    n_layers, n_heads = np.asarray(rows["gen"]).shape[:2]
    return {"id": str(record["id"]), "dataset": record["dataset"], "model": model,
            "question": record.get("question", ""), "answers": list(record.get("answers", [])),
            "fields": {k: record[k] for k in HEADER_FIELDS if k in record},
            "n_layers": int(n_layers), "n_heads": int(n_heads), "band": list(map(int, band)),
            "tasks": tasks}


_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 6px} table.meta td{padding:1px 10px 1px 0;vertical-align:top}
.controls{margin:10px 0;padding:8px;background:#f4f4f4;border-radius:4px}
.controls label{margin-right:14px}
.panels{display:flex;gap:16px}.panel{flex:1;min-width:0}
.panel h2{font-size:15px;margin:4px 0}.masses{font-size:12px;margin-bottom:6px;color:#444}
.text{font-family:ui-monospace,monospace;font-size:12px;line-height:1.9;white-space:pre-wrap;
word-break:break-all;border:1px solid #ccc;padding:6px;max-height:80vh;overflow:auto}
.seg{border:1px solid;border-radius:3px;padding:1px 0;margin:0 1px}
.seg>sup{font-family:system-ui,sans-serif;font-size:9px;padding:0 2px;color:#fff}
.tok{border-radius:2px}
.tok.piece{display:inline-block;min-width:2px;border-left:1px dotted #888}
.s-context{border-color:#4C72B0}.s-context>sup{background:#4C72B0}
.s-question{border-color:#DD8452}.s-question>sup{background:#DD8452}
.s-candidate{border-color:#55A868}.s-candidate>sup{background:#55A868}
.s-reference{border-color:#8172B3}.s-reference>sup{background:#8172B3}
.s-template{border-color:transparent}.s-template>sup{background:#999}
.last{outline:2px solid #000}
"""

_JS = r"""
const D = JSON.parse(document.getElementById('data').textContent);
function f32(b64) {
  const s = atob(b64), u = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) u[i] = s.charCodeAt(i);
  return new Float32Array(u.buffer);
}
const R = {}; for (const t of ['gen', 'eval']) R[t] = f32(D.tasks[t].rows);
const L = D.n_layers, H = D.n_heads;
function opt(sel, value, text) {
  const o = document.createElement('option'); o.value = value; o.textContent = text;
  sel.appendChild(o);
}
const layerSel = document.getElementById('layer'), headSel = document.getElementById('head');
opt(layerSel, 'band', `band mean (layers ${D.band[0]}-${D.band[D.band.length - 1]})`);
for (let l = 0; l < L; l++) opt(layerSel, l, `layer ${l}`);
opt(headSel, 'mean', 'mean of heads');
for (let h = 0; h < H; h++) opt(headSel, h, `head ${h}`);
function weights(t, layer, head) {
  const P = D.tasks[t].tokens.length, w = new Float32Array(P);
  const ls = layer === 'band' ? D.band : [Number(layer)];
  const hs = head === 'mean' ? [...Array(H).keys()] : [Number(head)];
  for (const l of ls) for (const h of hs) {
    const o = (l * H + h) * P;
    for (let p = 0; p < P; p++) w[p] += R[t][o + p];
  }
  const n = ls.length * hs.length; for (let p = 0; p < P; p++) w[p] /= n;
  return w;
}
function build(t) {
  const box = document.getElementById('text-' + t), toks = D.tasks[t].tokens;
  const labs = D.tasks[t].labels; let seg = null;
  toks.forEach((tok, p) => {
    if (!seg || labs[p] !== labs[p - 1]) {
      seg = document.createElement('span'); seg.className = 'seg s-' + labs[p];
      const sup = document.createElement('sup'); sup.textContent = labs[p];
      seg.appendChild(sup); box.appendChild(seg);
    }
    const s = document.createElement('span'); s.className = 'tok'; s.dataset.pos = p;
    s.textContent = tok.replace(/\n/g, '\u21b5\n');
    if (tok === '') s.classList.add('piece');  // leading bytes of the next token's character
    if (p === toks.length - 1) s.classList.add('last');
    seg.appendChild(s);
  });
}
function render() {
  const gamma = Number(document.getElementById('scale').value);
  const skip = document.getElementById('skipfirst').checked;
  for (const t of ['gen', 'eval']) {
    const w = weights(t, layerSel.value, headSel.value), labs = D.tasks[t].labels;
    let max = 0; for (let p = skip ? 1 : 0; p < w.length; p++) max = Math.max(max, w[p]);
    const mass = {};
    document.querySelectorAll('#text-' + t + ' .tok').forEach(s => {
      const p = Number(s.dataset.pos), a = Math.min(1, Math.pow(w[p] / (max || 1), gamma));
      s.style.backgroundColor = `rgba(214,39,40,${a.toFixed(3)})`;
      const piece = s.classList.contains('piece') ? ', byte piece' : '';
      s.title = `position ${p} (${labs[p]}${piece}): ${w[p].toFixed(5)}`;
    });
    labs.forEach((l, p) => { mass[l] = (mass[l] || 0) + w[p]; });
    const order = ['context', 'question', 'candidate', 'reference', 'template'];
    const keys = Object.keys(mass).sort((a, b) => order.indexOf(a) - order.indexOf(b));
    document.getElementById('mass-' + t).textContent = 'span mass: ' +
      keys.map(k => `${k} ${mass[k].toFixed(3)}`).join(' \u00b7 ');
  }
}
build('gen'); build('eval');
for (const id of ['layer', 'head', 'scale', 'skipfirst'])
  document.getElementById(id).addEventListener('change', render);
render();
"""


def _fmt(key: str, v: Any) -> str:
    if key in ("oracle_label", "verdict"):
        return {True: "Correct", False: "Incorrect"}.get(v, "none (unparseable)")
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_page(data: Mapping[str, Any]) -> str:
    """The HTML page of :func:`page_data` (module docstring, step 3): one string, all inline."""
    e = html.escape
    meta = [("model", data["model"]), ("question", data["question"]),
            ("gold answers", " | ".join(data["answers"]))]
    meta += [(k, _fmt(k, v)) for k, v in data["fields"].items()]
    rows = "".join(f"<tr><td><b>{e(k)}</b></td><td>{e(str(v))}</td></tr>" for k, v in meta)
    panels = "".join(
        f'<div class="panel"><h2>{t} prompt ({len(data["tasks"][t]["tokens"])} tokens; colour:'
        f' attention from the {"verdict" if t == "eval" else "answer"} position, outlined)</h2>'
        f'<div class="masses" id="mass-{t}"></div><div class="text" id="text-{t}"></div></div>'
        for t in TASKS)
    blob = json.dumps(data).replace("<", "\\u003c")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>interp view: {e(data["dataset"])}/{e(data["id"])}</title><style>{_CSS}</style></head>
<body><h1>{e(data["dataset"])} / {e(data["id"])}: last-token attention</h1>
<table class="meta">{rows}</table>
<div class="controls"><label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<label>colour scale <select id="scale"><option value="0.5">sqrt</option>
<option value="1">linear</option></select></label>
<label><input type="checkbox" id="skipfirst" checked> scale without the first token
(attention sink)</label></div>
<div class="panels">{panels}</div>
<script type="application/json" id="data">{blob}</script>
<script>{_JS}</script></body></html>
"""


def write_view(run: RunDir, handle: ModelHandle, record_id: str, out: str | Path | None = None,
               *, dataset: str | None = None, band: str = DEFAULT_BAND) -> Path:
    """Write the page of one record (module docstring).

    Args:
        run: the asymmetry run directory.
        handle: the run's model.
        record_id: the record's ``id``.
        out: the HTML file (default ``DIR/view/<dataset>/<id>.html``).
        dataset: the record's dataset, needed when the id occurs in several.
        band: layers of the "band mean" choice (:func:`interp.core.layers.parse_layers`).

    Returns:
        The path written.

    Raises:
        RunDirError: no such record, its prompts do not re-render, or another model.
        interp.core.errors.LayerSpecError: ``band`` outside the model.
    """
    layers = parse_layers(band, handle.n_layers)
    manifest = run.manifest()
    check_run_model(run, handle, manifest)
    rec = find_record(run, record_id, dataset)
    prompts = record_prompts(rec, handle.tokenizer,
                             templates_path=manifest.get("config", {}).get("templates_path"))
    tok = handle.tokenizer
    data = page_data(
        rec, {t: token_strings(tok, p.input_ids) for t, p in prompts.items()},
        {t: p.labels for t, p in prompts.items()},
        {t: record_rows(handle, p.input_ids).rows.numpy() for t, p in prompts.items()},
        layers, model=handle.spec)
    path = Path(out) if out else (run.path / "view" / safe_name(rec["dataset"])
                                  / f"{safe_name(rec['id'])}.html")
    atomic_write_text(path, render_page(data))
    return path
