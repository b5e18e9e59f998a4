"""What ``interp record`` writes equals the same quantities computed other ways (float32).

* full patterns = eager attention's ``output_attentions`` and, at the last query, the recorder's
  last rows (:func:`interp.hooks.recorder.record_rows`), to 1e-5;
* residual streams = eager attention's ``output_hidden_states`` with the off-by-one:
  ``hidden_states[i]`` is ``blocks.i.hook_resid_pre``, ``hidden_states[i + 1]`` is
  ``blocks.i.hook_resid_post`` except for the last block, whose ``hidden_states[-1]`` is AFTER
  the final norm;
* ``attn.hook_z`` times ``W_O`` = the attention block's output (``hook_attn_out``).
"""

from __future__ import annotations

import torch

from interp.hooks.capture import hooked
from interp.hooks.recorder import record_rows
from interp.hooks.wrappers import attn_implementation
from interp.judging.prompts import record_prompts
from interp.stages import record as stage
from interp.store.recordings import load_activations
from interp.testing import synthetic_probe_run


def _recorded(handle, tmp_path):
    run = synthetic_probe_run(tmp_path / "run", handle, n_good=1, n_bad=1)
    stage.record(run, handle, stage.RecordConfig(dtype="float32", band="all"),
                 log=lambda s: None)
    rec = run.read_records()[1]
    return run, rec, record_prompts(rec, handle.tokenizer)


def test_patterns_equal_eager_attention_and_the_recorders_last_rows(tiny, tmp_path):
    run, rec, prompts = _recorded(tiny, tmp_path)
    for task, p in prompts.items():
        ids = torch.tensor(p.input_ids)[None]
        with torch.no_grad(), attn_implementation(tiny, "eager"):
            eager = tiny.model(input_ids=ids, output_attentions=True).attentions
        rows = record_rows(tiny, p.input_ids).rows
        for layer in range(tiny.n_layers):
            got = load_activations(run, rec["id"], task,
                                   f"blocks.{layer}.attn.hook_pattern").tensor
            assert got.shape == (tiny.n_heads, len(p), len(p))
            assert (got - eager[layer][0]).abs().max().item() <= 1e-5, (task, layer)
            assert (got[:, -1] - rows[layer]).abs().max().item() <= 1e-5, (task, layer)


def test_residuals_equal_hidden_states_with_the_off_by_one(tiny, tmp_path):
    run, rec, prompts = _recorded(tiny, tmp_path)
    n = tiny.n_layers
    for task, p in prompts.items():
        # with its patterns recorded, a float32 layer's output is computed from the pattern, as
        # eager attention computes it (interp.hooks.recorder.pattern_attention): SDPA's differs
        # by float32 rounding (1.2e-5 here on residuals up to 21)
        with torch.no_grad(), attn_implementation(tiny, "eager"):
            hs = tiny.model(input_ids=torch.tensor(p.input_ids)[None],
                            output_hidden_states=True).hidden_states
        assert len(hs) == n + 1
        pre = load_activations(run, rec["id"], task, "hook_resid_pre").tensor
        post = load_activations(run, rec["id"], task, "hook_resid_post").tensor
        for i in range(n):
            torch.testing.assert_close(pre[i], hs[i][0], atol=1e-5, rtol=0)
        for i in range(n - 1):
            torch.testing.assert_close(post[i], hs[i + 1][0], atol=1e-5, rtol=0)
        # the last entry is after the final norm, not blocks.{n-1}.hook_resid_post
        assert (post[-1] - hs[-1][0]).abs().max() > 1e-2
        torch.testing.assert_close(tiny.model.model.norm(post[-1]), hs[-1][0], atol=1e-5,
                                   rtol=0)


def test_z_times_w_o_is_the_attention_output(tiny, tmp_path):
    run, rec, prompts = _recorded(tiny, tmp_path)
    p = prompts["eval"]
    names = [f"blocks.{x}.hook_attn_out" for x in range(tiny.n_layers)]
    with torch.no_grad(), attn_implementation(tiny, "eager"), \
            hooked(tiny.model, cache=names) as acts:
        tiny.model(input_ids=torch.tensor(p.input_ids)[None])
    for x in range(tiny.n_layers):
        z = load_activations(run, rec["id"], "eval", f"blocks.{x}.attn.hook_z").tensor
        w_o = tiny.model.model.layers[x].self_attn.o_proj.weight  # [d_model, heads * d_head]
        out = z.reshape(z.shape[0], -1) @ w_o.T
        torch.testing.assert_close(out, acts[names[x]][0], atol=1e-5, rtol=0)
