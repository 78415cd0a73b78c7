"""Side-by-side benchmarks of h5forge against baselines measured in the same run.

Run them as ``python -m benchmarks.bench_pack`` (etc.) from the repository root; each prints a
table and appends it, with the command and the machine's facts, to ``benchmarks/RESULTS.md``.
"""
