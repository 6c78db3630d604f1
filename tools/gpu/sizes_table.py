"""Prints the every-size table of tools/gpu/run_sizes.sh from its logs: ours (bench_train's
SUMMARY line) against the PyTorch + PEFT script (its SUMMARY line), one row per size.
Usage: python3 tools/gpu/sizes_table.py OUT_DIR"""
import pathlib
import re
import sys

SIZES = ["E2B", "E4B", "12B", "26B-A4B", "31B"]


def ours(text):
    m = re.search(r"SUMMARY tokens_per_s=(\d+) s_per_step=([\d.]+).*?peak_gb=([\d.]+) mfu_model=[\d.-]+ mfu_hw=([\d.]+)", text)
    return None if m is None else (float(m[1]), float(m[2]), float(m[3]), float(m[4]))


def script(text):
    m = re.search(r"SUMMARY steady tok/s=([\d,]+) s/step=([\d.]+).*?peak_alloc=([\d.]+) GB.*?MFU=([\d.na]+)", text)
    return None if m is None else (float(m[1].replace(",", "")), float(m[2]), float(m[3]), m[4])


def main():
    out = pathlib.Path(sys.argv[1])
    print("| size | ours tok/s | script tok/s | ratio | ours peak GB | script peak GB | ours MFU, hardware FLOPs (experts counted) |")
    print("|---|---|---|---|---|---|---|")
    for size in SIZES:
        o_log, s_log = out / f"ours_{size}.log", out / f"script_{size}.log"
        if not o_log.exists():
            continue
        o = ours(o_log.read_text(errors="replace"))
        s = script(s_log.read_text(errors="replace")) if s_log.exists() else None
        if o is None:
            print(f"| {size} | failed (see {o_log.name}) | | | | | |")
            continue
        ratio = f"{o[0] / s[0]:.2f}x" if s else "-"
        print(
            f"| {size} | {o[0]:,.0f} | {f'{s[0]:,.0f}' if s else '-'} | {ratio} | {o[2]:.1f} | "
            f"{f'{s[2]:.1f}' if s else '-'} | {100 * o[3]:.1f}% |"
        )


if __name__ == "__main__":
    main()
