import re,collections,sys,statistics
d=collections.defaultdict(list)
cur=None;fmt=None
for l in open(sys.argv[1]):
    if l.startswith('=='): cur=l.strip()[3:]
    elif l.startswith('##'): fmt=l.split(':')[0][3:]
    elif l.startswith('|'):
        c=[x.strip() for x in l.split('|')]
        d[(cur,fmt,c[1])].append(float(c[5]))
for k,v in sorted(d.items()): print(k, v, statistics.median(v))
