import json, glob, statistics, sys
rows = {}
for path in sorted(glob.glob('bench/results/validate_zen3_s66/ab/*/1P+1D/*/validation.json')):
    who = path.split('/')[4]; shape = path.split('/')[6]
    for r in json.load(open(path))["runs"]:
        m = r["measured"]
        rows.setdefault((shape, r["rate_rps"]), []).append((who, m["median_ttft_ms"], m["p90_ttft_ms"], m["median_tpot_ms"], m["slo_attainment"]))
for key, vals in sorted(rows.items()):
    print(key)
    for v in sorted(vals):
        print(f"   {v[0]:6s} TTFT p50 {v[1]:7.1f} p90 {v[2]:7.1f}  TPOT p50 {v[3]:5.1f}  att {v[4]:.2f}")
