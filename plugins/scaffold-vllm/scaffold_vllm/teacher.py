"""A teacher on a vLLM server: ``prompt_logprobs`` of the student's sequences (``teacher: {engine: vllm}``).

One ``POST /v1/completions`` per chunk of sequences: a list of token-id prompts (``prompt_ids +
completion_ids`` each), ``max_tokens: 1``, ``prompt_logprobs: k``. vLLM answers each prompt's
``choices[i].prompt_logprobs``: ``None`` for the first token, then per token a map from token id to
``{"logprob", "rank", "decoded_token"}`` holding the token itself and the top ``k``. The completion's
tokens are read from there (the alternatives become the teacher's top-k when ``top_k`` is set).
"""

from __future__ import annotations

from typing import Any

from scaffold_remote.client import ProtocolError
from scaffold_remote.teacher import Pair, RemoteTeacher, choices_in_order, number

from scaffold_core.teacher import TeacherScores


class VLLMTeacher(RemoteTeacher):
    """Teacher-forced logprobs from vLLM's ``prompt_logprobs`` (see the module docstring)."""

    path = "/v1/completions"

    def body(self, chunk: list[Pair]) -> dict[str, Any]:
        return self.completions_body(chunk, prompt_logprobs=self.top_k)

    def parse(self, data: Any, chunk: list[Pair]) -> list[TeacherScores]:
        out = []
        for (prompt, completion), choice in zip(chunk, choices_in_order(data, len(chunk))):
            entries = choice.get("prompt_logprobs")
            if entries is None and isinstance(data, dict):
                entries = data.get("prompt_logprobs")  # older servers put it beside the choices
            n, m = len(prompt), len(completion)
            if not isinstance(entries, list) or len(entries) < n + m:
                raise ProtocolError(f"prompt_logprobs has {len(entries) if isinstance(entries, list) else 'no'} "
                                    f"entries for a {n + m}-token sequence: this server does not return prompt "
                                    "logprobs (vLLM's /v1/completions does)")
            logprobs, tops = [], []
            for j, token in enumerate(completion):
                entry = entries[n + j]
                if not isinstance(entry, dict) or str(token) not in entry:
                    raise ProtocolError(f"prompt_logprobs[{n + j}] does not score token {token}")
                logprobs.append(number((entry[str(token)] or {}).get("logprob"), f"prompt_logprobs[{n + j}]"))
                if self.top_k:  # the entry holds the top k and the token itself (whatever its rank)
                    ranked = sorted(entry.items(), key=lambda kv: (kv[1] or {}).get("rank") or 0)
                    tops.append({int(t): number((v or {}).get("logprob"), f"prompt_logprobs[{n + j}]")
                                 for t, v in ranked[:self.top_k]})
            out.append(TeacherScores(logprobs, tops if self.top_k else None))
        return out
