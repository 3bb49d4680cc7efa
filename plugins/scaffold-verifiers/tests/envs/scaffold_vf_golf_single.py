"""The code rubric of scaffold_vf_golf without its environment: a single-turn taskset."""

from scaffold_vf_golf import GolfTaskset

__all__ = ["GolfTaskset"]
