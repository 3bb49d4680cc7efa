"""scaffold-gsm8k: GSM8K grade-school math: an RLVR task and its answer verifier for scaffold."""

__version__ = "0.1.0"
