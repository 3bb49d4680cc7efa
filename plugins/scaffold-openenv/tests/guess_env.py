"""An OpenEnv environment written as its template writes them (models, then an Environment subclass): guess a
number from 1 to 9 in at most three tries; each wrong guess is told higher or lower (reward 0), the right one
ends the episode (reward 1); a reply with no number is penalised (reward -0.5)."""

from __future__ import annotations

import random
import re
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., description="The guess, as text")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="What the game says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, low: int = 1, high: int = 9):
        super().__init__()
        self.low, self.high = low, high
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = low

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = random.Random(seed).randint(self.low, self.high)
        return GuessObservation(feedback=f"Guess my number from {self.low} to {self.high}.", reward=None)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.findall(r"-?\d+", action.message)
        if not found:
            return GuessObservation(feedback="Say a number.", reward=-0.5, done=self._state.step_count >= 3)
        guess = int(found[-1])
        if guess == self.secret:
            return GuessObservation(feedback="Right!", reward=1.0, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return GuessObservation(feedback=f"No, {hint}.", reward=0.0, done=self._state.step_count >= 3)

    @property
    def state(self) -> State:
        return self._state
