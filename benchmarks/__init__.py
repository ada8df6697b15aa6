"""vz benchmarks (PERFORMANCE.md). Run all with ``python -m benchmarks``; ``--smoke`` for a quick proof run.

Each benchmark is a module in this package with ``ID``, ``TITLE`` and ``async def run(ctx: Context) -> dict``.
Results are medians/percentiles and ratios measured side by side in one run, never single absolute times.
"""
