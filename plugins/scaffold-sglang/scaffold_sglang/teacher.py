"""A teacher on an SGLang server: ``input_token_logprobs`` of the student's sequences
(``teacher: {engine: sglang}``).

One ``POST /generate`` per chunk of sequences: ``input_ids`` a list of ``prompt_ids + completion_ids``,
``max_new_tokens: 0``, ``return_logprob: true`` and ``logprob_start_len`` one before each completion.
SGLang answers, per sequence, ``meta_info.input_token_logprobs``: ``[logprob, token_id, text]`` for the
input's tokens from that position, the first without a logprob; the completion's are the last ones, and
their ids are checked against those sent (``input_top_logprobs`` gives the top-k when ``top_k`` is set).
"""

from __future__ import annotations

from typing import Any

from scaffold_remote.client import ProtocolError
from scaffold_remote.teacher import Pair, RemoteTeacher, number

from scaffold_core.teacher import TeacherScores


class SGLangTeacher(RemoteTeacher):
    """Teacher-forced logprobs from SGLang's ``input_token_logprobs`` (see the module docstring)."""

    path = "/generate"

    def body(self, chunk: list[Pair]) -> dict[str, Any]:
        body: dict[str, Any] = {"input_ids": [list(p) + list(c) for p, c in chunk],
                                "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                                "return_logprob": True, "logprob_start_len": [max(0, len(p) - 1) for p, _ in chunk]}
        if self.top_k:
            body["top_logprobs_num"] = self.top_k
        return body

    def parse(self, data: Any, chunk: list[Pair]) -> list[TeacherScores]:
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list) or len(data) != len(chunk):
            raise ProtocolError(f"expected {len(chunk)} answers (one per sequence), got {str(data)[:200]}")
        out = []
        for (_, completion), answer in zip(chunk, data):
            meta = answer.get("meta_info") if isinstance(answer, dict) else None
            if not isinstance(meta, dict):
                raise ProtocolError(f"expected an answer with meta_info, got {str(answer)[:200]}")
            entries = meta.get("input_token_logprobs")
            m = len(completion)
            if not isinstance(entries, list) or len(entries) < m + 1:
                raise ProtocolError("the answer has too few input_token_logprobs for the completion: the server "
                                    "ignored return_logprob/logprob_start_len")
            tail = entries[len(entries) - m:]
            ids = [e[1] if isinstance(e, (list, tuple)) and len(e) > 1 else None for e in tail]
            if ids != list(completion):
                raise ProtocolError("input_token_logprobs name other tokens than the completion's")
            logprobs = [number(e[0], f"input_token_logprobs[{j}]") for j, e in enumerate(tail)]
            tops = None
            if self.top_k:
                given = meta.get("input_top_logprobs") or []
                if len(given) >= m:
                    tops = [{int(t): number(v, "input_top_logprobs") for v, t, *_ in (entry or [])}
                            for entry in given[len(given) - m:]]
            out.append(TeacherScores(logprobs, tops))
        return out
