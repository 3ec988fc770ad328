"""From a list of `Group`s to the tensors of one optimiser step: rows, rank shards, micro-batches.

Why it is shaped like this:
- Every rank receives the same global list of groups and derives the whole layout from it
  deterministically (which groups each rank trains, how each rank cuts its rows into micro-batches),
  so no collective is needed to agree on it; `Learner` checks the agreement with one checksum.
- Ranks get whole groups (group statistics stay local to a rank's rows), balanced by token count.
- Micro-batches are cut from length-sorted rows (or whole groups when the spec asks), by a row cap
  and optionally a token budget. Packed (`learner.packing`, the default), a micro-batch is its rows
  back to back in one sequence with per-row position ids and no padding (`learner.packed_attention`
  keeps attention inside each row); padded, each row is padded to the micro-batch's longest
  sequence. Either way the model outputs scatter back to the same [rows, width] layout the losses
  read. FSDP forward/backward are collectives, so every rank must run
  the same number of micro-batches: short plans are evened out by splitting their largest
  micro-batch, and only when nothing can be split by a dummy micro-batch (`None`) that contributes
  zero loss.
- The global `StepBatch` (masks, groups, rewards, μ) is built from the groups on every rank; only
  model outputs (π_prox, reference, PRM) have to be exchanged.
- Multi-turn rows (`envs/`): environment tokens (`Sample.env_mask`) are part of the model input like any
  response token (later turns are conditioned on them) but their response_mask is 0, so no loss,
  advantage, KL or entropy term reads them, and they never count as staleness.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from algos.batch import StepBatch
from buffer.records import Group


@dataclass(frozen=True)
class Row:
    """One response of the step (global row `index`, in group order)."""

    index: int
    group: int  # position of its group in the step's list (StepBatch.group_index)
    prompt: np.ndarray  # int64 [P]
    response: np.ndarray  # int64 [T]
    behav: np.ndarray  # float32 [T]
    versions: np.ndarray  # int64 [T]
    prefix: np.ndarray  # bool [T]
    reward: float
    truncated: bool = False  # the sample hit the generation limit before an eos (DAPO overlong handling)
    env: np.ndarray | None = None  # bool [T] environment tokens (multi-turn rows); None = all False
    teacher: np.ndarray | None = None  # float32 [T] log π_teacher scored by the driver's engine (teacher.scoring)

    def __post_init__(self) -> None:
        if self.env is None:
            object.__setattr__(self, "env", np.zeros(len(self.response), dtype=bool))

    @property
    def policy(self) -> np.ndarray:
        """bool [T]: the tokens the policy sampled (neither demonstration nor environment)."""
        return ~(self.prefix | self.env)

    @property
    def seq_len(self) -> int:
        """Length of the model input: prompt + response minus the last token (nothing predicts after it)."""
        return len(self.prompt) + max(len(self.response) - 1, 0)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.response)


def rows_from_groups(groups: list[Group], vocab_size: int | None = None) -> list[Row]:
    """Validate the groups and flatten them into rows (clear errors naming group and sample).

    With `vocab_size`, token ids outside [0, vocab_size) are an error (the embedding would fail later
    with an index error that names nothing)."""
    if not groups:
        raise ValueError("a step needs at least one group")
    rows: list[Row] = []
    for g, group in enumerate(groups):
        prompt = np.asarray(group.prompt_tokens, dtype=np.int64).reshape(-1)
        if prompt.size == 0:
            raise ValueError(f"group {group.group_id!r} has an empty prompt; the first response token needs "
                             "a prompt token to be predicted from")
        if not group.samples:
            raise ValueError(f"group {group.group_id!r} has no samples")
        _check_ids(prompt, vocab_size, f"group {group.group_id!r} prompt")
        for k, s in enumerate(group.samples):
            tokens = np.asarray(s.tokens, dtype=np.int64).reshape(-1)
            t = tokens.size
            arrays = {"logprobs": s.logprobs, "versions": s.versions, "prefix_mask": s.prefix_mask,
                      "env_mask": s.env_mask}
            if s.teacher_logprobs is not None:
                arrays["teacher_logprobs"] = s.teacher_logprobs
            for name, arr in arrays.items():
                if np.asarray(arr).reshape(-1).size != t:
                    raise ValueError(f"group {group.group_id!r} sample {k}: {name} has {np.asarray(arr).size} "
                                     f"entries for {t} tokens")
            _check_ids(tokens, vocab_size, f"group {group.group_id!r} sample {k}")
            if not np.isfinite(float(s.reward)):
                raise ValueError(f"group {group.group_id!r} sample {k}: non-finite reward {s.reward}")
            rows.append(Row(
                index=len(rows), group=g, prompt=prompt, response=tokens,
                behav=np.asarray(s.logprobs, dtype=np.float32).reshape(-1),
                versions=np.asarray(s.versions, dtype=np.int64).reshape(-1),
                prefix=np.asarray(s.prefix_mask, dtype=bool).reshape(-1), reward=float(s.reward),
                truncated=bool(s.truncated), env=np.asarray(s.env_mask, dtype=bool).reshape(-1),
                teacher=None if s.teacher_logprobs is None
                else np.asarray(s.teacher_logprobs, dtype=np.float32).reshape(-1)))
    return rows


def _check_ids(ids: np.ndarray, vocab_size: int | None, what: str) -> None:
    if vocab_size is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{what}: token ids must lie in [0, {vocab_size}), got range [{ids.min()}, {ids.max()}] "
                         "(was it tokenized for another model?)")


def group_rows(rows: list[Row]) -> list[list[int]]:
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r.group, []).append(r.index)
    return [out[g] for g in sorted(out)]


def split_minibatches(rows: list[Row], count: int) -> list[list[int]]:
    """The step's global row indices cut into `count` mini-batches of whole groups, in group order.

    G groups make mini-batches of ⌈G/count⌉ or ⌊G/count⌋ consecutive groups (the larger ones first),
    e.g. 10 groups in 4 mini-batches: 3, 3, 2, 2. The same cut every epoch (no shuffling). Raises when
    there are fewer groups than mini-batches (an empty mini-batch would be an optimiser step on nothing).
    """
    groups = group_rows(rows)
    if count > len(groups):
        raise ValueError(f"learner.mini_batches={count} needs at least {count} groups per step, got "
                         f"{len(groups)} — lower learner.mini_batches or raise learner.batch_prompts")
    size, extra = divmod(len(groups), count)
    out, start = [], 0
    for k in range(count):
        stop = start + size + (k < extra)
        out.append([i for g in groups[start:stop] for i in g])
        start = stop
    return out


def shard_groups(rows: list[Row], world_size: int, indices: list[int] | None = None) -> list[list[int]]:
    """Global row indices trained by each rank: whole groups, greedily balanced by token count.

    Only the rows `indices` are sharded (default: all; they must hold whole groups). Groups are taken
    longest first and each goes to the rank with the fewest tokens so far (ties: the lowest rank); each
    rank's rows are then listed in global order.
    """
    groups = group_rows(rows if indices is None else [rows[i] for i in indices])
    cost = [sum(rows[i].num_tokens for i in g) for g in groups]
    order = sorted(range(len(groups)), key=lambda g: (-cost[g], g))
    load = [0] * world_size
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for g in order:
        r = min(range(world_size), key=lambda k: (load[k], k))
        load[r] += cost[g]
        owned[r].extend(groups[g])
    return [sorted(o) for o in owned]


def plan_microbatches(rows: list[Row], indices: list[int], max_rows: int, *, whole_groups: bool = False,
                      max_tokens: int | str | None = None, packed: bool = False) -> list[list[int]]:
    """Cut the rows `indices` into micro-batches of at most `max_rows` rows and (optionally) at most
    `max_tokens` tokens: Σ sequence lengths when `packed`, rows × longest sequence when padded.

    Units (rows, or whole groups with `whole_groups`: a group is never split) are taken longest first.
    Padded, each unit joins the last micro-batch or opens the next (so a micro-batch holds similar
    lengths); packed, it joins the first micro-batch it fits in (first-fit decreasing: lengths need
    not match, so fewer micro-batches). A unit beyond the limits on its own forms a micro-batch alone.
    `max_tokens` "auto" (learner.micro_batch_tokens of a config the launch did not resolve, e.g. a `Learner`
    built in a test) is the row cap only, what auto means on CPU; the launch resolves it per device.
    """
    if max_tokens == "auto":
        max_tokens = None
    if max_rows < 1:
        raise ValueError(f"micro-batch size must be >= 1 row, got {max_rows}")
    units: dict[int, list[int]] = {}
    for i in indices:
        units.setdefault(rows[i].group if whole_groups else i, []).append(i)
    unit_list = sorted(units.values(), key=lambda u: (-max(rows[i].seq_len for i in u), u[0]))

    def cost(mb: list[int]) -> int:
        lengths = [rows[i].seq_len for i in mb]
        return sum(lengths) if packed else len(lengths) * max(lengths)

    plan: list[list[int]] = []
    for u in unit_list:
        for mb in plan if packed else plan[-1:]:
            if len(mb) + len(u) <= max_rows and (max_tokens is None or cost(mb + u) <= max_tokens):
                mb.extend(u)
                break
        else:
            plan.append(list(u))
    return plan


def equalize(plan: list[list[int]], target: int, rows: list[Row], whole_groups: bool) -> list[list[int] | None]:
    """Stretch `plan` to exactly `target` micro-batches: split the largest splittable micro-batch in
    half (never inside a group when `whole_groups`); pad with `None` (dummy) when nothing splits."""
    out: list[list[int] | None] = [list(mb) for mb in plan]
    while len(out) < target:
        best, units = None, None
        for k, mb in enumerate(out):
            if mb is None:
                continue
            us = _units(mb, rows, whole_groups)
            if len(us) >= 2 and (best is None or len(mb) > len(out[best])):
                best, units = k, us
        if best is None:
            out.append(None)
            continue
        half = len(units) // 2
        out[best:best + 1] = [sum(units[:half], []), sum(units[half:], [])]
    return out


def _units(mb: list[int], rows: list[Row], whole_groups: bool) -> list[list[int]]:
    if not whole_groups:
        return [[i] for i in mb]
    us: dict[int, list[int]] = {}
    for i in mb:
        us.setdefault(rows[i].group, []).append(i)
    return list(us.values())


@dataclass
class MicroBatch:
    """Model inputs of one micro-batch: its rows padded to their longest sequence ([b, L]), or, when
    `row_bounds` is set, packed back to back in one sequence ([1, S], S = Σ sequence lengths)."""

    rows: list[int]  # global row indices, in the order of the tensors below
    input_ids: torch.Tensor  # [b, L] padded, [1, S] packed
    attention_mask: torch.Tensor | None  # [b, L] when some row is padded, else None
    positions: torch.Tensor  # [N] flat index into input_ids of the hidden state predicting each target
    targets: torch.Tensor  # [N] response token ids
    row_of: torch.Tensor  # [N] row (0..b-1) of each target
    col_of: torch.Tensor  # [N] response position of each target
    width: int  # longest response in the micro-batch
    num_tokens: int  # prompt + response tokens (throughput accounting)
    dummy: bool = False
    position_ids: torch.Tensor | None = None  # [1, S] packed: position within its own row (0 at each row start)
    row_bounds: tuple[int, ...] | None = None  # packed: start of each row in S, then S

    def scatter(self, flat: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """[N] per-target values -> [b, width] (fill elsewhere)."""
        out = flat.new_full((len(self.rows), self.width), fill)
        out[self.row_of, self.col_of] = flat
        return out

    def inputs(self) -> dict:
        """Keyword arguments of `TokenScorer.forward` for this micro-batch."""
        return dict(input_ids=self.input_ids, attention_mask=self.attention_mask, positions=self.positions,
                    targets=self.targets, position_ids=self.position_ids, row_bounds=self.row_bounds)


def make_microbatch(rows: list[Row], indices: list[int] | None, pad_id: int, device: torch.device,
                    packed: bool = False) -> MicroBatch:
    """Tensors of a micro-batch, padded or `packed`; `indices=None` makes the one-token dummy used to
    even out plans. Row b's sequence (prompt + response[:-1]) starts at flat index start_b (b·L padded,
    Σ of the earlier rows' lengths packed); its hidden state at start_b + P − 1 + t predicts response
    token t."""
    if indices is None:
        z = torch.zeros(1, dtype=torch.long, device=device)
        return MicroBatch([], torch.full((1, 1), pad_id, dtype=torch.long, device=device), None, z, z, z, z,
                          width=1, num_tokens=0, dummy=True)
    seqs = [np.concatenate([rows[i].prompt, rows[i].response[:-1]]) for i in indices]
    lengths = np.array([len(s) for s in seqs])
    mask, extra = None, {}
    if packed:
        starts = np.concatenate([[0], np.cumsum(lengths)])
        ids = np.concatenate(seqs)[None]
        extra = dict(position_ids=torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])[None]).to(device),
                     row_bounds=tuple(int(x) for x in starts))
    else:
        length = int(lengths.max())
        starts = np.arange(len(seqs)) * length
        ids = np.full((len(seqs), length), pad_id, dtype=np.int64)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = s
        if (lengths < length).any():
            mask = torch.from_numpy((np.arange(length)[None] < lengths[:, None]).astype(np.int64)).to(device)
    pos, tgt, row_of, col_of = [], [], [], []
    for b, i in enumerate(indices):
        p, t = len(rows[i].prompt), len(rows[i].response)
        pos.append(starts[b] + p - 1 + np.arange(t))
        tgt.append(rows[i].response)
        row_of.append(np.full(t, b))
        col_of.append(np.arange(t))
    width = max(len(rows[i].response) for i in indices)

    def cat(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(device)

    return MicroBatch(list(indices), torch.from_numpy(ids.astype(np.int64)).to(device), mask, cat(pos), cat(tgt),
                      cat(row_of), cat(col_of), width=max(width, 1),
                      num_tokens=int(sum(rows[i].num_tokens for i in indices)), **extra)


def pad_rows(rows: list[Row], indices: list[int], field: str, width: int, dtype: torch.dtype,
             device: torch.device, fill: float = 0) -> torch.Tensor:
    """[len(indices), width] tensor of a per-token row field ('response', 'behav', 'prefix', 'versions', 'env')."""
    out = torch.full((len(indices), width), fill, dtype=dtype)
    for b, i in enumerate(indices):
        v = getattr(rows[i], field)
        out[b, :len(v)] = torch.tensor(np.asarray(v), dtype=dtype)  # a copy: wire arrays are read-only
    return out.to(device)


def global_step_batch(rows: list[Row], device: torch.device, step: int) -> StepBatch:
    """StepBatch of all rows (old_logprobs zero until the learner fills it). response_mask is 1 on the
    rows' response tokens except environment tokens."""
    idx = list(range(len(rows)))
    width = max(max(len(r.response) for r in rows), 1)
    lengths = torch.tensor([len(r.response) for r in rows])
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float().to(device)
    if any(r.env.any() for r in rows):  # multi-turn rows: environment tokens get no term at all
        mask = mask * (~pad_rows(rows, idx, "env", width, torch.bool, device, False)).float()
    return StepBatch(
        response_mask=mask,
        prefix_mask=pad_rows(rows, idx, "prefix", width, torch.bool, device, False),
        group_index=torch.tensor([r.group for r in rows], dtype=torch.int64, device=device),
        rewards=torch.tensor([r.reward for r in rows], dtype=torch.float32, device=device),
        old_logprobs=torch.zeros(len(rows), width, device=device),
        behav_logprobs=pad_rows(rows, idx, "behav", width, torch.float32, device) * mask,
        step=step,
        truncated=torch.tensor([r.truncated for r in rows], dtype=torch.bool, device=device),
    )


def staleness_metrics(rows: list[Row], version: int) -> dict[str, float]:
    """Lag (learner version − oldest generating version) over rows that hold generated tokens (demonstration
    and environment tokens are no policy's and do not count)."""
    lags = [version - int(r.versions[r.policy].min()) for r in rows if r.policy.any()]
    if not lags:
        return {"staleness/rows": 0.0}
    return {"staleness/min": float(min(lags)), "staleness/mean": float(np.mean(lags)),
            "staleness/max": float(max(lags)), "staleness/rows": float(len(lags))}


def layout_digest(rows: list[Row], plans: list[list[list[int] | None]]) -> int:
    """A 62-bit checksum of the step's data and plan (ranks compare it to catch diverging inputs)."""
    h = hashlib.blake2b(digest_size=8)
    for r in rows:
        h.update(r.prompt.tobytes())
        h.update(r.response.tobytes())
        h.update(np.float64(r.reward).tobytes())
    h.update(repr(plans).encode())
    return int.from_bytes(h.digest(), "little") >> 2
