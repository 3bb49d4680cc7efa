"""Port allocation under contention: 16 workers x 8 ports x 50 rounds, reserved at the same moment.

    python bench/ports.py [--workers 16] [--ports 8] [--rounds 50]

Prints collisions (a port handed to two workers in one round), EADDRINUSE at
the real bind and the time taken, for: disjoint rank slices; the same on a
host view without IPv6 (AF_INET6 sockets fail); every worker sharing one
slice (only binding keeps them apart); and, for contrast, the naive
probe-then-release allocation on a shared slice. Every figure but the last
must be 0.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    from scaffold_testkit.port_stress import run

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--ports", type=int, default=8)
    p.add_argument("--rounds", type=int, default=50)
    args = p.parse_args()
    cases = [("rank slices", {}), ("rank slices, no IPv6", {"no_ipv6": True}),
             ("one shared slice", {"same_slice": True}),
             ("naive probe-then-release, shared slice", {"same_slice": True, "probe_only": True})]
    print(f"ports: {args.workers} workers x {args.ports} ports x {args.rounds} rounds")
    print(f"{'case':<40} {'collisions':>10} {'EADDRINUSE':>10} {'errors':>6} {'seconds':>8}")
    bad = 0
    for name, options in cases:
        f = run(args.workers, args.ports, args.rounds, **options)
        print(f"{name:<40} {f['collisions']:>10} {f['eaddrinuse']:>10} {f['reserve_errors']:>6} {f['seconds']:>8.2f}")
        if not options.get("probe_only"):
            bad += f["collisions"] + f["eaddrinuse"] + f["reserve_errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
