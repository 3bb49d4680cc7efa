"""Agents the controller tests run: plain functions against an OpenAI client, as users write them."""

from __future__ import annotations

import asyncio
import json

from serve_helpers import ADD_TOOL, smolagents_add_tool

from scaffold_serve.client import set_reward


async def tool_agent(row, client):
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(4):
        reply = await client.chat.completions.create(model="scaffold", messages=messages, tools=[ADD_TOOL])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return None


def sync_agent(row, client):
    reply = client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": row["question"]}])
    return reply.choices[0].message.content


async def rewarding_agent(row, client):
    await client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": row["question"]}])
    await set_reward(client, 0.25)
    return "whatever"


async def answerless_agent(row, client):
    await client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": row["question"]}])
    return None


async def silent_agent(row, client):
    return "42"


async def broken_agent(row, client):
    await client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": row["question"]}])
    raise ValueError("the agent gave up")


async def parallel_agent(row, client):
    ask = [{"role": "user", "content": row["question"]}]
    replies = await asyncio.gather(*(client.chat.completions.create(model="scaffold", messages=ask) for _ in range(3)))
    return replies[0].choices[0].message.content


async def wrong_model_agent(row, client):
    await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": row["question"]}])


async def short_answer_agent(row, client):
    """One call; the run's sampling decides temperature and length (sampling: config)."""
    ask = [{"role": "user", "content": row["question"]}]
    reply = await client.chat.completions.create(model="scaffold", messages=ask)
    return reply.choices[0].message.content


def smolagents_agent(row, client):
    """smolagents' ToolCallingAgent with its defaults (tool_choice=required, history resent as rewritten text)."""
    import smolagents

    model = smolagents.OpenAIServerModel(model_id="scaffold", api_base=str(client.base_url), api_key=client.api_key)
    return smolagents.ToolCallingAgent(tools=[smolagents_add_tool()], model=model,
                                       verbosity_level=0).run(row["question"])


async def forcing_agent(row, client):
    """Forces a tool call; reports the server's refusal as its answer."""
    import openai

    try:
        await client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": row["question"]}],
                                             tools=[ADD_TOOL], tool_choice="required")
    except openai.BadRequestError as exc:
        await client.chat.completions.create(model="scaffold", messages=[{"role": "user", "content": "Hi"}])
        return f"refused: {exc.body['message'] if isinstance(exc.body, dict) else exc}"
    return "constrained"
