"""Comparing serving systems side by side on one rate grid (bench/goodput_vs_vllm.py runs it):
`config` (what is run, in which order, with which requests), `budget` (what still fits the
time), `goodput` (goodput per system and SLO pair from the runs, pure) and `report` (tables,
JSON, markdown, plots)."""
