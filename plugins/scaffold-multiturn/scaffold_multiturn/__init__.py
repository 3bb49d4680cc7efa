"""scaffold-multiturn: Multi-turn chat rollouts with token-faithful trajectories for scaffold."""

__version__ = "0.1.0"
