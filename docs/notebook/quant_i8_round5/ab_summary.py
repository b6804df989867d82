import json,sys,statistics,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    wt,js=l.split(' ',1)
    try: r=json.loads(js)
    except Exception: continue
    d[wt].append((r['ms'],r['cpu_ms'],r['tn_ms']['1'],r['tn_ms']['8']))
for wt,v in d.items():
    cols=list(zip(*v))
    print(wt, 'decode ms', [round(x,2) for x in cols[0]], 'median %.2f'%statistics.median(cols[0]), 'cpu %.2f'%statistics.median(cols[1]), 'T1 %.2f T8 %.2f T8/T1 %.3f'%(statistics.median(cols[2]),statistics.median(cols[3]),statistics.median([b/a for a,b in zip(cols[2],cols[3])])))
