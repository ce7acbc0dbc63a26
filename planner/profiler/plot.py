"""The profile as a picture: measured points and the fitted model, one panel per phase."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.perf_model import PerfModel
from planner.profile import Profile


def plot_profile(profile: Profile, model: PerfModel, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (pre, dec, kv) = plt.subplots(1, 3, figsize=(15, 4.5))
    for chunk in sorted({r.chunk_tokens for r in profile.prefill}, reverse=True):  # the engine's own, then smaller
        rows = sorted((r for r in profile.prefill if r.chunk_tokens == chunk), key=lambda r: r.prompt_tokens)
        line = pre.plot([r.prompt_tokens for r in rows], [r.prefill_s * 1e3 for r in rows], "o",
                        label=f"measured, {chunk}-token chunks")
        grid = np.linspace(1, rows[-1].prompt_tokens, 200).astype(int)
        pre.plot(grid, [model.prefill_s(int(n), chunk) * 1e3 for n in grid], "-", color=line[0].get_color(),
                 label=f"fit, {chunk}-token chunks")
    pre.set(xlabel="prompt tokens", ylabel="prefill time (ms)", title="prefill alone")
    pre.legend()

    per_seq = sorted({round(r.context_tokens / r.batch_size) for r in profile.decode})
    for context in per_seq:
        rows = sorted((r for r in profile.decode if round(r.context_tokens / r.batch_size) == context),
                      key=lambda r: r.batch_size)
        line = dec.plot([r.batch_size for r in rows], [r.step_s * 1e3 for r in rows], "o", label=f"~{context} ctx/seq")
        dec.plot([r.batch_size for r in rows], [model.decode_step_s(r.batch_size, r.context_tokens) * 1e3 for r in rows],
                 "-", color=line[0].get_color())
    dec.set(xlabel="batch size (sequences)", ylabel="decode step (ms)", title="decode step (points) and fit (lines)")
    dec.legend()

    for transport in profile.transports:
        rows = sorted((r for r in profile.kv_transfer if r.transport == transport), key=lambda r: r.kv_bytes)
        sizes = [r.kv_bytes / 1e6 for r in rows]
        line = kv.loglog(sizes, [r.transfer_s * 1e3 for r in rows], "o", label=transport)
        kv.loglog(sizes, [model.transfer_s(r.kv_bytes, transport) * 1e3 for r in rows], "-", color=line[0].get_color())
    kv.set(xlabel="KV bytes (MB)", ylabel="transfer time (ms)", title="KV transfer (points) and fit (lines)")
    kv.legend()
    fig.suptitle(f"{profile.model.name} on {profile.hardware.num_cores} core(s) of {profile.hardware.cpu_model}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
