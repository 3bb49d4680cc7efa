"""Trainer-side batching: padded tensor dicts and micro-batches balanced across data-parallel ranks."""
