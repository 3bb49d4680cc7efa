"""One rank of the process-group tests (run by tests/test_distributed.py; prints one JSON line).

usage: distributed_rank.py RANK WORLD INIT_METHOD MODE   (MODE: collectives | rendezvous-timeout)
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    rank, world, init_method, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    from scaffold_areal.microbatch import MicroBatchSpec, min_micro_batches, split_padded_tensor_dict

    from scaffold_core import distributed

    if mode == "rendezvous-timeout":
        t0 = time.monotonic()
        try:
            distributed.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout_s=3)
        except distributed.DistributedError as exc:
            print(json.dumps({"error": str(exc), "seconds": time.monotonic() - t0}))
            return 0
        print(json.dumps({"error": None}))
        return 1

    import torch
    import torch.distributed as dist

    groups = distributed.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                            timeout_s=60)
    try:
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)  # default group
        cpu_backend = str(dist.get_backend(groups.cpu_group))
        # Unequal data: rank r holds 8 + 3r sequences; a budget of 64 tokens per micro-batch.
        from scaffold_areal.microbatch import allocate_synced
        from scaffold_areal.padding import to_padded_tensor_dict

        from scaffold_core.trajectory import TrainingSample

        lengths = [8 + (7 * i + 5 * rank) % 40 for i in range(8 + 3 * rank)]
        samples = [TrainingSample([1] * n, [1] * n, [0.0] * n, [0] * n, 1.0, 0.0, f"{rank}-{i}", 0, "g", 0, "stop")
                   for i, n in enumerate(lengths)]
        spec = MicroBatchSpec(max_tokens_per_mb=64)
        mbs = split_padded_tensor_dict(to_padded_tensor_dict(samples), spec)  # synced over the Gloo group
        try:  # rank 0 with only 2 sequences: too few for the agreed count, and every rank must say so
            allocate_synced(lengths[:2] if rank == 0 else lengths, spec)
            short_error = None
        except ValueError as exc:
            short_error = str(exc)
        objs = distributed.all_gather_objects({"rank": rank})
        groups.barrier()
        print(json.dumps({"rank": rank, "sum": float(total.item()), "cpu_backend": cpu_backend,
                          "local_min": min_micro_batches(lengths, spec), "count": len(mbs),
                          "rows": sum(len(g) for g in mbs.groups), "n": len(lengths),
                          "smallest": min(len(g) for g in mbs.groups), "short_error": short_error,
                          "gathered": [o["rank"] for o in objs], "url": groups.init_method}))
    finally:
        groups.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
