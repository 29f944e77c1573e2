import sys, collections
def load(path):
    looks=[]
    for l in open(path):
        if not l.startswith('DIAG fd'): continue
        f=l.split()
        d={f[i]:f[i+1] for i in range(1,len(f)-1,2) if f[i] in ('fd','rate','al','busy','acked')}
        looks.append((d['fd'],int(d['rate']),d['al']=='true',int(d['busy']),int(d['acked'])))
    return looks
class Kernel:
    def __init__(s): s.rate=0; s.last=None
    def see(s,rate,al,busy,acked):
        if (rate,al)!=s.last and rate>0 and not al: s.rate=rate/1e6
        s.last=(rate,al)
class Busy:
    def __init__(s,W,k=1): s.W=W; s.base=None; s.rate=0; s.hist=[]; s.k=k
    def see(s,rate,al,busy,acked):
        if s.base is None: s.base=(busy,acked); return
        if busy-s.base[0]>=s.W:
            s.hist.append((acked-s.base[1])/(busy-s.base[0])); s.base=(busy,acked)
            s.rate=max(s.hist[-s.k:])
def run(path,mk):
    looks=load(path); fds=sorted(set(x[0] for x in looks)); slow=fds[0]
    est={fd:mk() for fd in fds}
    # evaluate at each group of 4 looks (a placement)
    wrong_fast=wrong_slow=n=0; started=False
    for i,(fd,rate,al,busy,acked) in enumerate(looks):
        est[fd].see(rate,al,busy,acked)
        if fd==fds[-1]:
            rates={f:est[f].rate for f in fds}
            fastest=max(rates.values())
            if fastest==0: continue
            # only judge once the slow lane is shaped: after 20% of looks
            if i < len(looks)*0.2: continue
            n+=1
            for f in fds:
                clearly = rates[f]>0 and rates[f]*2<fastest
                if f==slow and not clearly: wrong_slow+=1
                if f!=slow and clearly: wrong_fast+=1
    return n,wrong_slow,wrong_fast
for name,mk in [('kernel',Kernel),('busy50',lambda:Busy(50000)),('busy100',lambda:Busy(100000)),('busy50max2',lambda:Busy(50000,2)),('busy30max3',lambda:Busy(30000,3))]:
    out=[]
    for r in range(4):
        n,ws,wf=run(f'all_reduce-l4-{r}-rank0.log',mk)
        out.append(f"slow-missed {ws/n:.2f} fast-as-slow {wf/n/3:.2f}")
    print(f"{name:12}", ' | '.join(out))
print()
looks=load('all_reduce-l4-1-rank0.log'); fds=sorted(set(x[0] for x in looks))
for fd in fds:
    b=Busy(50000)
    seq=[]
    for (f,rate,al,busy,acked) in looks:
        if f==fd:
            n=len(b.hist); b.see(rate,al,busy,acked)
            if len(b.hist)>n: seq.append(round(b.hist[-1],1))
    print(fd, seq)
