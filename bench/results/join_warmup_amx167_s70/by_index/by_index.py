import json, sys, statistics
sys.path.insert(0,'.')
from pathlib import Path
from pdserve.engine_step_trace import engine_steps
out=Path(sys.argv[1]); kept=json.loads((out/'phases.json').read_text())
steps=engine_steps(out/'steps', kept['worker_ids']['decode'])
bins=[(0,0),(1,4),(5,12),(13,24),(25,60),(61,120),(121,400)]
for ph in kept['phases']:
    if not any(k in ph['name'] for k in ('lone-long','closed:long-short:1','closed:short-long','short-long@','long-short@')): continue
    inside=[s for s in steps if ph['start_s']<=s.start_s<ph['end_s'] and s.only_decodes]
    idx=None; by={b:[] for b in bins}
    for s in inside:
        if s.joined: idx=0
        elif idx is not None: idx+=1
        if idx is None: continue
        if s.batch!=1 and 'closed:short' not in ph['name'] and '@' not in ph['name']: continue
        for b in bins:
            if b[0]<=idx<=b[1]: by[b].append(s.duration_s*1e3)
    print(f"{ph['name']:22s}", " ".join(f"{b[0]}-{b[1]}: {statistics.median(v):.2f}({len(v)})" for b,v in by.items() if v))
