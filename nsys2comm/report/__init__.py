"""Self-contained HTML reports (Altair / Vega-Lite, inlined, offline) built from the catalog's analyses.

``build_report(con, out_path)`` writes the page; the chart functions take catalog query frames and return
Altair charts, for use in notebooks too. What the page shows is described as data in :mod:`.sections`.
"""

from .charts import (
    CLASS_COLORS,
    busbw_chart,
    latency_chart,
    msg_size_histogram_chart,
    overlap_by_collective_chart,
    overlap_by_rank_chart,
    p2p_latency_chart,
    pair_heatmap_chart,
    skew_heatmap_chart,
    step_timeline_chart,
    straggler_chart,
    time_breakdown_chart,
)
from .findings import Finding, all_findings
from .html import build_report, collect

__all__ = [
    "CLASS_COLORS", "Finding", "all_findings", "build_report", "busbw_chart", "collect", "latency_chart",
    "msg_size_histogram_chart", "overlap_by_collective_chart", "overlap_by_rank_chart", "p2p_latency_chart",
    "pair_heatmap_chart", "skew_heatmap_chart", "step_timeline_chart", "straggler_chart", "time_breakdown_chart",
]
