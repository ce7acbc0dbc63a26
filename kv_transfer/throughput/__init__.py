"""KV transfer throughput: pdserve's transports against the raw transports and memcpy.

`pair` (a producer process with a paged cache behind a real `TransferServer` and the raw reference
servers of `reference`; a consumer with every way of receiving) -> `measure` (interleaved timed
rounds) -> `summary` (rows, medians, quartiles, ratios; pure) -> `report` (markdown, JSON, chart).
`bench/kv_transfer_throughput.py` runs it for the `bench` model.
"""
