"""What engines that run a model in this process share: finding and loading a model (``model_loading``), sampling
like the embedded engine (``sampler``), a sequence's decode state (``decode_rows``); and the canned benchmark
engine. Heavy libraries are imported inside functions, never here."""
