import sys, statistics
sys.path.insert(0,'.')
from pathlib import Path
from pdserve.engine_step_trace import engine_steps
d=Path(sys.argv[1])
f=[p for p in d.glob('steps-decode-*.csv')][0]
who=f.name.removeprefix('steps-').rsplit('-',1)[0]
steps=engine_steps(d, who)
bins=[(0,0),(1,2),(3,4),(5,8),(9,12),(13,18),(19,30),(31,1000)]
by={b:[] for b in bins}; idx=None
for s in steps:
    if not s.only_decodes: idx=None; continue
    if s.joined and s.batch==1: idx=0
    elif s.batch!=1: idx=None; continue
    elif idx is not None: idx+=1
    if idx is None: continue
    for b in bins:
        if b[0]<=idx<=b[1]: by[b].append(s.duration_s*1e3)
print(d.parts[-4], " ".join(f"{b[0]}-{b[1]}: {statistics.median(v):.2f}({len(v)})" for b,v in by.items() if v))
