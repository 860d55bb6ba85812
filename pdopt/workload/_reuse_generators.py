"""Seeded workloads whose prompts share prefixes: shared system prompts and multi-turn sessions.

Both build each prompt from named pieces of token content and give every full block of
``block_tokens`` tokens an identity (:class:`PrefixBlocks`) that is equal exactly when the block's
content is: a block that lies wholly inside system prompt ``s`` is ``(s, j)``; any other block
``j`` of a conversation ``c`` is ``(c, j)``. A conversation only ever appends (its history is
its earlier questions and answers), so its block ``j`` holds the same tokens at every turn that
has it full, and a later turn reuses every full block of the earlier turns' prompts.

Seeds follow :mod:`pdopt.workload._generators`: each random column draws from its own child
stream of ``numpy.random.SeedSequence(seed)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdopt._validation import check_int_at_least, check_non_negative, param_error
from pdopt.model_spec import DEFAULT_BLOCK_TOKENS
from pdopt.workload._generators import ConstantLengths, LengthDistribution, _rng
from pdopt.workload._prefix import PrefixBlocks, mix64
from pdopt.workload._workload import FloatArray, IntArray, Workload

# Child streams of SeedSequence(seed), after _generators' arrival (0), input (1), output (2).
_QUESTION_STREAM, _ANSWER_STREAM, _USER_STREAM, _TURNS_STREAM, _THINK_STREAM = 1, 2, 3, 4, 5
# Tags that keep the identities of system-prompt blocks and conversation blocks apart.
_SYSTEM_TAG, _CONVERSATION_TAG = 0x5359_5354_454D, 0x434F_4E56


def _lengths(value: int | LengthDistribution, name: str, owner: str) -> LengthDistribution:
    if isinstance(value, bool):
        raise param_error(name, owner, "an int >= 1 or a length distribution", value)
    if isinstance(value, int | np.integer):
        return ConstantLengths(check_int_at_least(int(value), 1, name, owner))
    if not hasattr(value, "sample"):
        raise param_error(name, owner, "an int >= 1 or a length distribution", value)
    return value


@dataclass(slots=True)
class _Prompts:
    """Rows built one by one (mutable scratch, private): prompt and output lengths and blocks."""

    system_prompt_tokens: int
    block_tokens: int
    max_input_tokens: int | None
    inputs: list[int]
    outputs: list[int]
    blocks: list[IntArray]
    next_conversation: int = 0

    def system_block_ids(self, system_prompt: int) -> IntArray:
        j = np.arange(self.system_prompt_tokens // self.block_tokens, dtype=np.int64)
        return mix64(_SYSTEM_TAG, system_prompt, j)

    def add(
        self, system_ids: IntArray, conversation: int, history: int, question: int, answer: int
    ) -> None:
        """One request: system prompt, then ``history`` tokens of ``conversation``, then the
        question; its full blocks past the system prompt's are the conversation's."""
        prompt = self.system_prompt_tokens + history + question
        full = prompt // self.block_tokens
        shared = system_ids[:full]
        own = np.arange(len(shared), full, dtype=np.int64)
        self.blocks.append(np.concatenate([shared, mix64(_CONVERSATION_TAG, conversation, own)]))
        self.inputs.append(prompt)
        self.outputs.append(answer)

    def new_conversation(self) -> int:
        self.next_conversation += 1
        return self.next_conversation - 1

    def fits(self, history: int, question: int) -> bool:
        """Whether a turn with this history stays within ``max_input_tokens`` (None: always)."""
        cap = self.max_input_tokens
        return cap is None or self.system_prompt_tokens + history + question <= cap


def _check_common(
    owner: str, block_tokens: int, max_input_tokens: int | None
) -> tuple[int, int | None]:
    block_tokens = check_int_at_least(block_tokens, 1, "block_tokens", owner)
    if max_input_tokens is not None:
        max_input_tokens = check_int_at_least(max_input_tokens, 1, "max_input_tokens", owner)
    return block_tokens, max_input_tokens


def shared_prefix_workload(
    arrival_s: npt.ArrayLike,
    *,
    num_system_prompts: int,
    system_prompt_tokens: int,
    users_per_system_prompt: int,
    question_tokens: int | LengthDistribution,
    output_tokens: int | LengthDistribution,
    multi_turn: bool = False,
    max_input_tokens: int | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    seed: int | None = None,
    name: str = "shared_prefix",
) -> Workload:
    """Requests from users of a few shared system prompts, with prefix blocks.

    ``num_system_prompts`` system prompts of ``system_prompt_tokens`` tokens each have
    ``users_per_system_prompt`` users; each request (one per arrival) comes from a user drawn
    uniformly among all ``num_system_prompts * users_per_system_prompt`` and is that user's system
    prompt followed by a question of ``question_tokens`` tokens; it generates ``output_tokens``.
    Requests of one system prompt share its ``system_prompt_tokens // block_tokens`` full blocks.

    With ``multi_turn``, each user holds one conversation: the prompt of its turn ``k`` is the
    system prompt, the user's earlier questions and answers, then the new question, so it reuses
    every full block of the user's previous prompt. When a turn would exceed
    ``max_input_tokens`` (None: no limit), the user's history is dropped first (a new
    conversation, sharing only the system prompt).

    Parameters
    ----------
    arrival_s : array of float, shape (n,)
        Sorted arrival times in seconds, e.g. :func:`poisson_arrivals` or
        :func:`piecewise_rate_arrivals` (a :class:`RateSchedule`).
    question_tokens, output_tokens : int or LengthDistribution
        Tokens per question and per answer: a constant, or drawn per request.
    block_tokens : int
        Tokens per prefix block (16, as vLLM and SGLang).
    seed : int or None
        Seeds the user choice and the lengths (independent streams).

    Examples
    --------
    >>> from pdopt.workload import poisson_arrivals
    >>> w = shared_prefix_workload(poisson_arrivals(2.0, n_requests=4, seed=0),
    ...     num_system_prompts=1, system_prompt_tokens=64, users_per_system_prompt=3,
    ...     question_tokens=20, output_tokens=8, seed=0)
    >>> w.input_tokens.tolist(), w.prefix_blocks.counts().tolist()
    ([84, 84, 84, 84], [5, 5, 5, 5])
    """
    owner = "shared_prefix_workload"
    prompts_n = check_int_at_least(num_system_prompts, 1, "num_system_prompts", owner)
    sys_tokens = check_int_at_least(system_prompt_tokens, 0, "system_prompt_tokens", owner)
    users = check_int_at_least(users_per_system_prompt, 1, "users_per_system_prompt", owner)
    block_tokens, max_input_tokens = _check_common(owner, block_tokens, max_input_tokens)
    arrival = np.asarray(arrival_s, dtype=np.float64)
    n = len(arrival)
    questions = _lengths(question_tokens, "question_tokens", owner).sample(
        n, _rng(seed, _QUESTION_STREAM, owner)
    )
    answers = _lengths(output_tokens, "output_tokens", owner).sample(
        n, _rng(seed, _ANSWER_STREAM, owner)
    )
    user_of = _rng(seed, _USER_STREAM, owner).integers(0, prompts_n * users, size=n)
    rows = _Prompts(sys_tokens, block_tokens, max_input_tokens, [], [], [])
    system_ids = [rows.system_block_ids(s) for s in range(prompts_n)]
    conversation: dict[int, int] = {}
    history: dict[int, int] = {}
    for i in range(n):
        user, q, a = int(user_of[i]), int(questions[i]), int(answers[i])
        if not multi_turn or user not in conversation or not rows.fits(history[user], q):
            conversation[user], history[user] = rows.new_conversation(), 0
        rows.add(system_ids[user // users], conversation[user], history[user], q, a)
        history[user] += q + a
    inputs, outputs = np.asarray(rows.inputs, np.int64), np.asarray(rows.outputs, np.int64)
    return Workload(arrival, inputs, outputs, name, _blocks(rows, n))


def session_workload(
    session_arrival_s: npt.ArrayLike,
    *,
    turns: int | LengthDistribution,
    think_time_s: float,
    question_tokens: int | LengthDistribution,
    output_tokens: int | LengthDistribution,
    system_prompt_tokens: int = 0,
    max_input_tokens: int | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    seed: int | None = None,
    name: str = "sessions",
) -> Workload:
    """Multi-turn chat sessions whose history grows, with prefix blocks.

    Session ``s`` starts at ``session_arrival_s[s]`` and has ``turns`` turns (a constant or
    drawn per session, >= 1). Turn ``k + 1`` arrives an exponential think time (mean
    ``think_time_s``; 0 sends all turns at once) after turn ``k`` *arrives*: the workload is open
    loop, so when a reply takes longer than the think time the next turn arrives before it ends.
    The prompt of turn ``k`` is the shared system prompt (``system_prompt_tokens``, one for all
    sessions; 0 for none), every earlier question and answer of the session, then the new
    question (``question_tokens``); it generates ``output_tokens``. When a turn would exceed
    ``max_input_tokens`` (None: no limit), the session's history is dropped first (as a client
    truncating a chat). Requests are returned in arrival order.

    Examples
    --------
    >>> w = session_workload([0.0, 1.0], turns=3, think_time_s=5.0, question_tokens=32,
    ...                      output_tokens=16, seed=0)
    >>> sorted(w.input_tokens.tolist())
    [32, 32, 80, 80, 128, 128]
    """
    owner = "session_workload"
    think_time_s = check_non_negative(think_time_s, "think_time_s", owner)
    sys_tokens = check_int_at_least(system_prompt_tokens, 0, "system_prompt_tokens", owner)
    block_tokens, max_input_tokens = _check_common(owner, block_tokens, max_input_tokens)
    starts = np.asarray(session_arrival_s, dtype=np.float64)
    counts = _lengths(turns, "turns", owner).sample(len(starts), _rng(seed, _TURNS_STREAM, owner))
    n = int(counts.sum())
    questions = _lengths(question_tokens, "question_tokens", owner).sample(
        n, _rng(seed, _QUESTION_STREAM, owner)
    )
    answers = _lengths(output_tokens, "output_tokens", owner).sample(
        n, _rng(seed, _ANSWER_STREAM, owner)
    )
    gaps = _rng(seed, _THINK_STREAM, owner).exponential(think_time_s or 1.0, size=n)
    if think_time_s == 0:
        gaps[:] = 0.0
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    gaps[first] = 0.0  # a session's first turn arrives at the session's start
    session_of = np.repeat(np.arange(len(starts)), counts)
    arrival = np.repeat(starts, counts) + _cumsum_within(gaps, first, counts)
    rows = _Prompts(sys_tokens, block_tokens, max_input_tokens, [], [], [])
    system_ids = rows.system_block_ids(0)
    conversation, history = -1, 0
    for i in range(n):
        q, a = int(questions[i]), int(answers[i])
        if i == first[session_of[i]] or not rows.fits(history, q):
            conversation, history = rows.new_conversation(), 0
        rows.add(system_ids, conversation, history, q, a)
        history += q + a
    return Workload.from_unsorted(arrival, rows.inputs, rows.outputs, name, _blocks(rows, n))


def _cumsum_within(values: FloatArray, first: IntArray, counts: IntArray) -> FloatArray:
    """Running sums of ``values`` restarting at each group's ``first`` index."""
    total = np.cumsum(values)
    before = np.repeat(total[first] - values[first], counts)
    return np.asarray(total - before, dtype=np.float64)


def _blocks(rows: _Prompts, n: int) -> PrefixBlocks:
    counts = np.fromiter((len(b) for b in rows.blocks), dtype=np.int64, count=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    hashes = np.concatenate(rows.blocks) if n else np.zeros(0, dtype=np.int64)
    return PrefixBlocks(offsets, hashes, rows.block_tokens)
