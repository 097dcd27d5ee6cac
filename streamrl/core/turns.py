"""Per-turn metadata of a multi-turn trajectory, written by the environment episode and
read by turn-level and role-conditioned credit (plain lists in ``Trajectory.metadata``).

    turn_spans    [(start, end), ...]  token positions of each model turn in input_ids
    turn_rewards  [r_0, r_1, ...]      the reward credited to each turn (they sum to the
                                       trajectory's reward)
    turn_keys     ["3fa1...", ...]     each turn's state: equal keys within a group are
                                       the same observation (GiGPO's anchor states)
    role_key      "KuhnPoker-v0/seat_1"  the game and seat the trajectory played

A trajectory without them (a single-turn answer) is one turn: all its generated tokens,
its reward.
"""

TURN_SPANS = "turn_spans"
TURN_REWARDS = "turn_rewards"
TURN_KEYS = "turn_keys"
ROLE_KEY = "role_key"
