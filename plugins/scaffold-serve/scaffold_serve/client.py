"""What agent code may call besides the OpenAI client: posting a session's reward (or answer).

``set_reward(client, 1.0)`` with the client ``solve`` was given (or any client whose base URL is
a session's, ``http://host:port/sessions/{id}/v1``) posts to ``/sessions/{id}/reward`` with the
client's own API key. With an ``openai.AsyncOpenAI`` it returns a coroutine to await.
"""

from __future__ import annotations

from typing import Any


def reward_url(client: Any) -> str:
    """``.../sessions/{id}/reward`` for a client whose base URL is ``.../sessions/{id}/v1``."""
    base = str(client.base_url).rstrip("/")
    if not base.endswith("/v1") or "/sessions/" not in base:
        raise ValueError(f"the client's base URL {base!r} is not a session's (…/sessions/<id>/v1)")
    return base[: -len("/v1")] + "/reward"


def set_reward(client: Any, reward: float | None = None, *, answer: str | None = None) -> Any:
    """Post the session's ``reward`` (and/or its final ``answer``, for the task's verifier to score)."""
    import httpx

    body: dict[str, Any] = {}
    if reward is not None:
        body["reward"] = reward
    if answer is not None:
        body["answer"] = answer
    url = reward_url(client)
    headers = {"Authorization": f"Bearer {client.api_key}"}
    if type(client).__name__.startswith("Async"):
        async def post() -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=30) as http:
                reply = await http.post(url, json=body, headers=headers)
            reply.raise_for_status()
            return reply.json()

        return post()
    reply = httpx.post(url, json=body, headers=headers, timeout=30)
    reply.raise_for_status()
    return reply.json()
