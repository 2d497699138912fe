"""rewards: verifiable reward functions, the reward manager, and the audits that catch reward hacking.

Reward functions are called as ``fn(prompts, completions, **fields)`` with one
entry per completion in every list (or all by keyword, TRL's way, when a function
names a parameter ``prompts`` or ``completions``), and return one float, or None for
"not mine to score", per completion. The built-in ones never evaluate, compile or
import model text, and every one returns in bounded time on any string; a user's
function is bounded by its ``timeout_s``. Functions are found by name in the
entry-point group ``rewards.functions`` or as ``module:function`` /
``path/to/file.py:function`` (``rewards.registry``).
"""

from rewards.auditor import AuditLimits, RewardAuditor
from rewards.audits import ProbeResult, probe_rewards
from rewards.countdown import countdown_reward
from rewards.formatting import format_reward
from rewards.length import length_penalty
from rewards.manager import ON_ERROR_CHOICES, RewardError, RewardManager, RewardResult, RewardSpec, Scores
from rewards.math_answers import boxed_reward, gsm8k_reward, numeric_answer, numeric_answer_reward
from rewards.registry import REWARD_FUNCTIONS, RewardFn, make_reward
from rewards.remote import RemoteReward, RemoteRewardError, remote_judge, remote_score

__all__ = [
    "AuditLimits",
    "ON_ERROR_CHOICES",
    "ProbeResult",
    "REWARD_FUNCTIONS",
    "RewardAuditor",
    "RewardError",
    "RemoteReward",
    "RemoteRewardError",
    "RewardFn",
    "RewardManager",
    "RewardResult",
    "RewardSpec",
    "Scores",
    "boxed_reward",
    "countdown_reward",
    "format_reward",
    "gsm8k_reward",
    "length_penalty",
    "make_reward",
    "numeric_answer",
    "numeric_answer_reward",
    "probe_rewards",
    "remote_judge",
    "remote_score",
]
