"""Runs of unwritten (non-resident) pages of 256 KiB or more in a process's main heap, from
/proc/PID/pagemap (as root): where they start, their size, and how far from the heap's end.

    python docs/notebook/soak_rss/holes.py PID
"""
import struct, sys
pid = sys.argv[1]
vmas = []
for line in open(f"/proc/{pid}/maps"):
    h = line.split()
    if h[-1] == "[heap]":
        a, b = (int(x, 16) for x in h[0].split("-"))
        vmas.append((a, b))
P = 4096
with open(f"/proc/{pid}/pagemap", "rb") as fh:
    for a, b in vmas:
        fh.seek(a // P * 8)
        data = fh.read((b - a) // P * 8)
        present = [(struct.unpack_from("<Q", data, i * 8)[0] >> 63) & 1 for i in range((b - a) // P)]
        runs, start = [], None
        for i, p in enumerate(present + [1]):
            if not p and start is None:
                start = i
            elif p and start is not None:
                runs.append((start, i)); start = None
        big = [(hex(a + s * P), round((e - s) * P / 2**20, 2), round((b - (a + e * P)) / 2**20, 2)) for s, e in runs if e - s >= 64]
        print(hex(a), round((b - a) / 2**20, 1), "MiB; non-resident runs >= 256 KiB (start, MiB, MiB from the end):", big)
