"""The loops of a cuobjdump -sass listing: each backward branch's body that issues HGMMA or
MUFU, its instruction count and opcode mix, and (--seq LO HI) one address range as a compressed
sequence (runs of one opcode class counted; HGMMA, WARPGROUP, BAR, SYNCS, BRA and SHFL lines in
full), to compare a forward step's instruction stream with another kernel's (e.g. a cubin that
scripts/fa4_sass.sh compiled without a GPU). CPU only:
    python3 scripts/sass_loops.py kernel.sass
    python3 scripts/sass_loops.py kernel.sass --seq 5960 a4a0
"""
import argparse
import collections
import re
import signal

_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
_FULL = ("HGMMA", "WARPGROUP", "BAR", "SYNCS", "BRA", "SHFL", "NANOSLEEP")


def instructions(path):
    out = []
    with open(path) as f:
        for line in f:
            m = _LINE.match(line)
            if m:
                out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def loops(ins):
    where = {a: i for i, (a, _) in enumerate(ins)}
    for i, (a, t) in enumerate(ins):
        m = re.search(r"0x([0-9a-f]+)\s*$", t)
        if opcode(t) == "BRA" and m:
            target = int(m.group(1), 16)
            if target <= a and target in where:
                yield where[target], i


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("--seq", nargs=2, metavar=("LO", "HI"), help="hex addresses, inclusive")
    ap.add_argument("--top", type=int, default=25, help="opcodes listed per loop")
    args = ap.parse_args()
    ins = instructions(args.sass)
    if args.seq:
        lo, hi = (int(x, 16) for x in args.seq)
        run, n = None, 0
        for a, t in ins:
            if not lo <= a <= hi:
                continue
            op = opcode(t)
            if op.startswith(_FULL):
                if run:
                    print(f"   {run} x{n}")
                run, n = None, 0
                print(f"{a:#06x} {t[:110]}")
            elif op.split(".")[0] == run:
                n += 1
            else:
                if run:
                    print(f"   {run} x{n}")
                run, n = op.split(".")[0], 1
        if run:
            print(f"   {run} x{n}")
        return
    for s, e in loops(ins):
        ops = collections.Counter(opcode(t) for _, t in ins[s:e + 1])
        hgmma = sum(v for k, v in ops.items() if k.startswith("HGMMA"))
        mufu = sum(v for k, v in ops.items() if k.startswith("MUFU"))
        if hgmma == 0 and mufu == 0:
            continue
        mix = ", ".join(f"{k} {v}" for k, v in ops.most_common(args.top))
        print(f"loop {ins[s][0]:#x}-{ins[e][0]:#x}: {e - s + 1} instructions, HGMMA {hgmma}, {mix}")


if __name__ == "__main__":
    main()
