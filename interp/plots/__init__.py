"""Figures drawn from stored tables (metrics.json, summaries), never from live models.

Each ``plot_*`` function takes the parsed table and an output folder, writes ``NAME.png`` and
``NAME.pdf`` there, and returns the PNG path. One module per study: :mod:`interp.plots.asymmetry`,
:mod:`interp.plots.attention`, :mod:`interp.plots.probes`, :mod:`interp.plots.patching`,
:mod:`interp.plots.steering`, :mod:`interp.plots.transfer`, :mod:`interp.plots.record` and
:mod:`interp.plots.compare` (models side by side); what they share (colours, saving, notes) is
:mod:`interp.plots.common`. The figure functions are re-exported here.
"""

from interp.plots.asymmetry import plot_asymmetry
from interp.plots.attention import (
    plot_context_ratio,
    plot_head_context_heatmaps,
    plot_span_mass_layerwise,
)
from interp.plots.patching import plot_patching
from interp.plots.probes import plot_probes
from interp.plots.steering import plot_steering
from interp.plots.transfer import (
    plot_transfer_acceptance,
    plot_transfer_matrix,
    plot_transfer_patching,
)

__all__ = ["plot_asymmetry", "plot_context_ratio", "plot_head_context_heatmaps",
           "plot_patching", "plot_probes", "plot_span_mass_layerwise", "plot_steering",
           "plot_transfer_acceptance", "plot_transfer_matrix", "plot_transfer_patching"]
