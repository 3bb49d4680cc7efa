"""A two-seat zero-sum game, shaped like the library's multi-agent self-play environments: each hand's task has
no prompt of its own (the environment opens one interaction per seat and talks to each), seat 0 moves first,
and a seat whose move cannot be read forfeits, so the other seat may never act. The payoff (+1 / -1, zero-sum)
is recorded on both seats' traces. The game is matching pennies: player 0 wins when the coins match."""

from __future__ import annotations

import re

import verifiers.v1 as vf

RULES = ("You play matching pennies as Player {seat} in hand {hand}. Player 0 wins when both coins show the same "
         "side, Player 1 when they differ. Reply with exactly one of [heads] or [tails].")
ASK = "Your move: [heads] or [tails]?"


def move_of(reply: str) -> str | None:
    """The one side named in the reply (with or without brackets), else None (a forfeit)."""
    found = set(re.findall(r"\b(heads|tails)\b", reply.lower()))
    return found.pop() if len(found) == 1 else None


class DuelData(vf.TaskData):
    info: dict


class DuelTask(vf.Task[DuelData]):
    pass


class DuelEnvConfig(vf.EnvConfig):
    player0: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    player1: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class DuelEnv(vf.Env[DuelEnvConfig]):
    async def run(self, task, agents):
        hand = task.data.info["hand"]
        seats = [vf.Task(vf.TaskData(idx=task.data.idx, prompt=None, system_prompt=RULES.format(seat=i, hand=hand)))
                 for i in (0, 1)]
        moves: list[str] = []
        forfeited = None
        async with agents.player0.interaction(seats[0]) as player0, \
                agents.player1.interaction(seats[1]) as player1:
            for seat, talk in enumerate((player0, player1)):
                segment = await talk.turn(ASK)
                move = None if segment.terminated else move_of(segment.last_reply)
                if move is None:
                    forfeited = seat
                    break
                moves.append(move)
        if forfeited is not None:
            net0 = 1.0 if forfeited == 1 else -1.0
        else:
            net0 = 1.0 if moves[0] == moves[1] else -1.0
        for seat, trace in enumerate((player0.trace, player1.trace)):
            trace.record_reward("payoff", net0 if seat == 0 else -net0)
            trace.record_metric("forfeit", float(forfeited == seat))


class DuelTaskset(vf.Taskset[DuelTask, vf.TasksetConfig]):
    def load(self):
        for hand in range(4):
            yield DuelTask(DuelData(idx=hand, name=f"hand#{hand}", prompt=None, info={"hand": hand}))


__all__ = ["DuelEnv", "DuelTaskset"]
