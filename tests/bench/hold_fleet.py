"""Hold a private fleet up for an outside client and print ``{"url": ..., "pids": ...}``.

    python -m tests.bench.hold_fleet --model-dir DIR [--workers 4] [--speedup 1] [--frontends 1]

Stops (draining) on SIGTERM or SIGINT. ``side_by_side.sh`` uses it to measure jetfleet with the
same client as NVIDIA Dynamo.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from base.logs import configure_logging
from tests.bench.fleetctl import BenchFleet


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--served-model-name", default="anchor-model")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--speedup", type=float, default=1000.0)
    ap.add_argument("--frontends", type=int, default=1)
    ap.add_argument("--router", default="kv")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-gpu-blocks", type=int, default=16384)
    args = ap.parse_args(argv)
    configure_logging("warning", "console")
    worker_args = (
        "--model", args.model_dir, "--served-model-name", args.served_model_name,
        "--speedup", str(args.speedup), "--block-size", str(args.block_size),
        "--num-gpu-blocks", str(args.num_gpu_blocks),
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with BenchFleet(
        workers=args.workers,
        worker_args=worker_args,
        router=args.router,
        frontend_args=("--processes", str(args.frontends)),
    ) as fleet:
        print(json.dumps({"url": fleet.url, "pids": fleet.pids}), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
