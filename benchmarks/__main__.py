"""``python -m benchmarks [--quick] [--only SUITE,...]``: print ratios, save JSON and a PNG."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks.harness import Group, group_from_json
from benchmarks.report import LoadLog, markdown, table, write_json
from benchmarks.servers import run_context

# In the order they run: cheap and CPU-bound first, servers after.
SUITES = (
    "hot_path",
    "round_trips",
    "tail_latency",
    "threads",
    "per_value",
    "orm_sqlalchemy",
    "asyncio_loop",
    "orm_django",
    "orm_mongoengine",
    "serials",
    "scaling",
    "many_sequences",
    "snowflake",
)
RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small workloads, under 2 minutes")
    parser.add_argument(
        "--only", default="", help=f"comma-separated suites to run (of: {', '.join(SUITES)})"
    )
    parser.add_argument("--out", type=Path, help="JSON file (default: benchmarks/results/)")
    parser.add_argument("--chart", type=Path, help="PNG file (default: next to the JSON)")
    parser.add_argument(
        "--redraw", type=Path, metavar="JSON", help="only redraw the chart and table of a saved run"
    )
    parser.add_argument(
        "--markdown", action="store_true", help="with --redraw: print Markdown tables instead"
    )
    args = parser.parse_args(argv)
    if args.redraw:
        return redraw(args.redraw, args.chart, markdown_only=args.markdown)

    chosen = [name.strip() for name in args.only.split(",") if name.strip()] or list(SUITES)
    unknown = [name for name in chosen if name not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")

    started = time.time()
    load = LoadLog()
    mode = "quick" if args.quick else "full"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    out = args.out or RESULTS / f"{stamp}-{mode}.json"
    chart_path = args.chart or out.with_suffix(".png")
    groups: list[Group] = []
    failed: list[str] = []
    with run_context(args.quick) as ctx:
        ctx.log(f"autoseq benchmarks, {mode} run, {ctx.repeats} interleaved repeats")
        for name in chosen:
            ctx.log(f"-- {name}")
            suite_started = time.perf_counter()
            try:
                module = importlib.import_module(f"benchmarks.suites.{name}")
                groups.extend(module.run(ctx))
            except Exception as exc:
                failed.append(name)
                traceback.print_exc()
                groups.append(
                    Group(name, f"{name}: crashed", "", subject="", unavailable=f"error: {exc!r}")
                )
            ctx.log(f"   {name} took {time.perf_counter() - suite_started:.1f} s")
            # Saved after every suite, so a run cut short keeps what it measured.
            write_json(groups, out, quick=args.quick, checks=ctx.checks, started=started, load=load)
        checks = ctx.checks

    print(table(groups))
    if checks:
        print("\n== Targets")
        for check in checks:
            print(f"   {'PASS' if check['passed'] else 'MISS'}  {check['name']}: {check['detail']}")
    load.stop()
    write_json(groups, out, quick=args.quick, checks=checks, started=started, load=load)
    print(f"\nraw results: {out}")
    try:
        from benchmarks.chart import draw

        draw(groups, chart_path, mode=mode)
        print(f"chart: {chart_path}")
    except ImportError as exc:
        print(f"chart: skipped ({exc})")
    print(f"total: {time.time() - started:.0f} s; {load.summary()}")
    if failed:
        print(f"suites that crashed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def redraw(saved: Path, chart_path: Path | None, *, markdown_only: bool = False) -> int:
    from benchmarks.chart import draw

    document = json.loads(saved.read_text())
    groups = [group_from_json(data) for data in document["groups"]]
    if markdown_only:
        print(markdown(groups))
        return 0
    print(table(groups))
    target = chart_path or saved.with_suffix(".png")
    draw(groups, target, mode=document["mode"])
    print(f"chart: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
