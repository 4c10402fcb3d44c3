"""The metrics reference: every family of `common/metrics.py`'s FAMILIES, the table from which the master builds
what `/metrics` exposes (name, type, labels, help, histogram buckets)."""

from mindspore_serving.common import metrics
from reference_gen.markdown import GENERATED_NOTE, cell, code, table

SUFFIXES = {
    metrics.COUNTER: ("_total",),
    metrics.GAUGE: ("",),
    metrics.HISTOGRAM: ("_bucket", "_sum", "_count"),
}


def _series(name: str, kind: str) -> str:
    return ", ".join(code(name + suffix) for suffix in SUFFIXES[kind])


def render() -> str:
    rows = []
    for name, family in metrics.FAMILIES.items():
        labels = ", ".join(code(label) for label in family.labels)
        rows.append([code(name), family.kind, labels, cell(family.help), _series(name, family.kind)])
    buckets = {}
    for name, family in metrics.FAMILIES.items():
        if family.buckets:
            buckets.setdefault(family.buckets, []).append(name)
    bucket_rows = [
        [", ".join(code(n) for n in names), cell(", ".join(f"{b:g}" for b in bounds) + ", +Inf")]
        for bounds, names in buckets.items()
    ]
    return "\n".join(
        [
            GENERATED_NOTE,
            "# Metrics\n",
            "Every metric the server exposes in Prometheus' text format, on the RESTful port's `GET /metrics` and "
            "on the `--metrics` port. The master keeps the requests' metrics; the workers' (model calls, LLM "
            "engines) are pulled from them at scrape time and carry their servable, version and device labels. "
            "The `mindspore_serving:` names are vLLM's, under this package's prefix.\n",
            table(["metric", "type", "labels", "meaning", "series"], rows),
            "## Histogram buckets\n",
            "Upper bounds (`le`) of each histogram's buckets:\n",
            table(["metrics", "buckets"], bucket_rows),
        ]
    )
