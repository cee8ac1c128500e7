"""Command line: ``python -m mpcourse bench [--out DIR] [--quick] [--budget-s S] [--device D]
[--threads N]``.

Runs the benchmark suite (:func:`mpcourse.bench.run_suite`) on this machine's GPU, or its CPU
when there is none, and writes ``report.md`` with PNG figures and ``report.json`` (the same
figures as data; :func:`mpcourse.bench.write_report`) to ``DIR`` (default
``bench-report/<device-slug>-<date>/``).
"""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpcourse",
                                     description="The mpcourse library's command line.")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench", help="benchmark this device and write a report",
        description="Measure matmul TFLOP/s per precision against the datasheet, memory "
                    "bandwidth, the cost of unaligned sizes, and a transformer block in FP32, "
                    "TF32, FP16, BF16 and FP8, and the timer against Triton's do_bench; write "
                    "report.md, PNG figures and report.json.")
    bench.add_argument("--out", help="report folder (default: bench-report/<device>-<date>/)")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes and budgets: a smoke test in seconds, "
                            "not figures to quote")
    bench.add_argument("--budget-s", type=float, default=None, metavar="S",
                       help="time budget for the whole suite in seconds: steps that would "
                            "start after it is spent are skipped, and the report says so")
    bench.add_argument("--device", default=None,
                       help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    bench.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: 1 on a CPU, unchanged on a GPU)")
    args = parser.parse_args(argv)
    if args.budget_s is not None and not args.budget_s > 0:
        parser.error(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")

    import matplotlib
    matplotlib.use("Agg")  # files only, no window: works without a display
    from mpcourse.bench import run_suite, write_report

    results = run_suite(args.device, quick=args.quick, threads=args.threads,
                        budget_s=args.budget_s)
    path = write_report(results, args.out)
    print(f"Report written to {path} (figures beside it), {results.seconds:.0f} s on "
          f"{results.info.name}.")
    if results.info.kind == "cpu":
        print("This was a CPU run: the report says what a GPU would show. "
              "Run the same command on a GPU machine to measure one.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
