"""An environment written for the verifiers API before 0.4 (``verifiers.envs``, a ``load_environment()``
returning an Environment): the shape most environments of the hub still have."""

import verifiers as vf
from verifiers.envs.singleturn_env import SingleTurnEnv


def load_environment(**kwargs):
    def correct(completion, answer, **_):
        return float(answer in str(completion))

    return SingleTurnEnv(dataset=None, rubric=vf.Rubric(funcs=[correct]), **kwargs)
