import os, time, statistics as st
os.sched_setaffinity(0,{0})
import numpy as np, torch
torch.set_num_threads(1)
a=np.random.default_rng(0).standard_normal((384,384),dtype=np.float32); b=a.copy()
x=torch.randn(1024,768,dtype=torch.bfloat16); w=torch.randn(768,3072,dtype=torch.bfloat16)
for _ in range(20): a@b; x@w
f32=[];bf=[]
end=time.time()+40
while time.time()<end:
    t=time.perf_counter(); n=0
    while time.perf_counter()-t<0.5: a@b; n+=1
    f32.append((time.perf_counter()-t)/n*1e3)
    t=time.perf_counter(); n=0
    while time.perf_counter()-t<0.5: x@w; n+=1
    bf.append((time.perf_counter()-t)/n*1e3)
q=lambda v:(round(sorted(v)[len(v)//10],3),round(st.median(v),3),round(sorted(v)[9*len(v)//10],3))
print('fp32 numpy p10/p50/p90 ms',q(f32),' swing %.2f'%(q(f32)[2]/q(f32)[0]))
print('bf16 torch p10/p50/p90 ms',q(bf),' swing %.2f'%(q(bf)[2]/q(bf)[0]))
