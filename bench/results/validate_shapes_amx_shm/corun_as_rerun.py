"""The AMX profile with its co-run stretches replaced by bench/corun.py's five rounds on the same VM
right after the validation (prompt 1.013x, decode step 0.989x, bench/results/corun_amx_steady/
unbracketed_corun.md): what the validation's simulation charges when the co-run is measured without
the VM's drift. Ad hoc, writes tiny_2cpu_amx_corun_rerun_served.json beside this file."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    profile = json.loads((HERE / "tiny_2cpu_amx_served.json").read_text())
    profile["serving"]["corun_prefill_stretch"], profile["serving"]["corun_decode_stretch"] = 1.013, 0.989
    profile["notes"] = profile.get("notes", "") + "\nco-run stretches replaced by bench/corun.py's (corun_as_rerun.py)"
    (HERE / "tiny_2cpu_amx_corun_rerun_served.json").write_text(json.dumps(profile, indent=1))
