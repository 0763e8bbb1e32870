"""The verl adapter against the real verl package (DataProto, its masks and GRPO advantages)."""

from __future__ import annotations

import functools
import uuid

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
verl_protocol = pytest.importorskip("verl.protocol")

import lakebuffer as lb  # noqa: E402
from lakebuffer.dataset import RolloutDataset, SamplingDataset  # noqa: E402
from lakebuffer.integrations.verl import (  # noqa: E402
    from_dataproto,
    push_dataproto,
    sample_dataproto,
    to_dataproto,
)

DataProto = verl_protocol.DataProto
PAD, EOS = 0, 2


def verl_batch(n_prompts: int = 4, group: int = 4, p_len: int = 12, r_len: int = 16, seed: int = 0,
               step: int = 3) -> DataProto:
    """A generated + scored batch laid out exactly as verl's rollout and reward code lay it out."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.torch_functional import get_response_mask

    g = torch.Generator().manual_seed(seed)
    b = n_prompts * group
    plen = torch.randint(1, p_len + 1, (n_prompts,), generator=g).repeat_interleave(group)
    ptok = torch.randint(3, 1000, (n_prompts, p_len), generator=g).repeat_interleave(group, dim=0)
    prompt_mask = (torch.arange(p_len)[None, :] >= (p_len - plen)[:, None]).long()  # left padding
    prompts = torch.where(prompt_mask.bool(), ptok, PAD)
    responses = torch.randint(3, 1000, (b, r_len), generator=g)
    eos_at = torch.randint(0, r_len + 4, (b,), generator=g)  # some rows run to the length limit
    for i, e in enumerate(eos_at.tolist()):
        if e < r_len:
            responses[i, e] = EOS
    response_mask = get_response_mask(response_id=responses, eos_token=EOS, dtype=torch.int64)
    responses = torch.where(response_mask.bool(), responses, PAD)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    old_log_probs = -torch.rand(b, r_len, generator=g) * response_mask
    scores = torch.rand(b, generator=g)
    token_level_scores = torch.zeros(b, r_len)
    token_level_scores[torch.arange(b), response_mask.sum(-1) - 1] = scores  # as verl's reward managers
    uid = np.array([str(uuid.UUID(int=seed * 1000 + i // group)) for i in range(b)], dtype=object)
    advantages, returns = compute_grpo_outcome_advantage(token_level_scores, response_mask, uid)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
            "response_mask": response_mask,
            "old_log_probs": old_log_probs,
            "token_level_scores": token_level_scores,
            "token_level_rewards": token_level_scores.clone(),
            "advantages": advantages,
            "returns": returns,
        },
        non_tensors={"uid": uid, "data_source": np.array(["gsm8k"] * b, dtype=object)},
        meta_info={"global_steps": step, "temperature": 1.0},
    )


TENSOR_KEYS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
               "old_log_probs", "token_level_scores", "token_level_rewards", "advantages", "returns")


def assert_same(a: DataProto, b: DataProto, keys=TENSOR_KEYS) -> None:
    assert len(a) == len(b)
    for k in keys:
        assert a.batch[k].dtype == b.batch[k].dtype, k
        assert a.batch[k].shape == b.batch[k].shape, k
        assert torch.equal(a.batch[k], b.batch[k]), k
    assert list(a.non_tensor_batch["uid"]) == list(b.non_tensor_batch["uid"])


def test_rows_from_dataproto():
    dp = verl_batch()
    rows = from_dataproto(dp)
    mask = dp.batch["attention_mask"].bool()
    p = dp.batch["prompts"].shape[1]
    assert rows.num_rows == len(dp)
    assert rows.column("policy_version").to_pylist() == [3] * len(dp)  # meta_info["global_steps"]
    assert rows.column("group_id").to_pylist() == list(dp.non_tensor_batch["uid"])
    for i in range(len(dp)):
        assert rows.column("prompt_ids")[i].as_py() == dp.batch["prompts"][i][mask[i, :p]].tolist()
        assert rows.column("response_ids")[i].as_py() == dp.batch["responses"][i][mask[i, p:]].tolist()
        assert 0 not in rows.column("response_ids")[i].as_py()  # no padding stored
    np.testing.assert_allclose(rows.column("reward").to_numpy(), dp.batch["token_level_rewards"].sum(-1).numpy(),
                               rtol=1e-6)
    lengths = [len(x) for x in rows.column("response_logprobs").to_pylist()]
    assert lengths == dp.batch["response_mask"].sum(-1).tolist()


def test_dataproto_round_trip_through_the_buffer(tmp_path):
    dp = verl_batch()
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=8, snapshot_interval_s=0) as buf:
        keys = push_dataproto(buf, dp)
        assert len(keys) == len(dp)
        rows = buf.get(keys)
        back = to_dataproto(rows, pad_token_id=PAD, max_prompt_length=dp.batch["prompts"].shape[1],
                            max_response_length=dp.batch["responses"].shape[1], meta_info=dp.meta_info)
        assert isinstance(back, DataProto)
        assert_same(dp, back)
        assert back.meta_info == dp.meta_info
        assert list(back.non_tensor_batch["key"]) == keys.to_pylist()
        # the same after the rows were written back to the warm tier
        buf.evict_all()
        again = to_dataproto(buf.get(keys), pad_token_id=PAD, max_prompt_length=12, max_response_length=16)
        assert_same(dp, again)


def test_dataproto_operations_work_on_the_result():
    dp = verl_batch()
    back = to_dataproto(from_dataproto(dp).append_column("key", pa.array([f"k{i}" for i in range(len(dp))])),
                        max_prompt_length=12, max_response_length=16)
    both = DataProto.concat([back, back])
    assert len(both) == 2 * len(dp)
    halves = back.chunk(2)
    assert [len(h) for h in halves] == [len(dp) // 2] * 2
    sel = back.select(batch_keys=["input_ids", "attention_mask"], non_tensor_batch_keys=["uid"])
    assert set(sel.batch.keys()) == {"input_ids", "attention_mask"}
    assert torch.equal(back[[0, 2]].batch["input_ids"], dp[[0, 2]].batch["input_ids"])
    # verl's compute_response_mask convention: the response part of the attention mask
    r = back.batch["responses"].shape[1]
    assert torch.equal(back.batch["attention_mask"][:, -r:], back.batch["response_mask"])


def test_default_widths_are_the_longest_rows():
    dp = verl_batch(seed=4)
    rows = from_dataproto(dp)
    back = to_dataproto(rows)
    p = max(len(x) for x in rows.column("prompt_ids").to_pylist())
    r = max(len(x) for x in rows.column("response_ids").to_pylist())
    assert back.batch["prompts"].shape == (len(dp), p)
    assert back.batch["responses"].shape == (len(dp), r)
    mask = back.batch["attention_mask"].bool()
    for i in range(len(dp)):
        assert back.batch["input_ids"][i][mask[i]].tolist() == (rows.column("prompt_ids")[i].as_py()
                                                                + rows.column("response_ids")[i].as_py())


def test_truncation_keeps_prompt_tail_and_response_head():
    dp = verl_batch(seed=5)
    rows = from_dataproto(dp)
    back = to_dataproto(rows, max_prompt_length=3, max_response_length=4)
    for i in range(len(dp)):
        pr = rows.column("prompt_ids")[i].as_py()
        rs = rows.column("response_ids")[i].as_py()
        got_p = back.batch["prompts"][i][back.batch["attention_mask"][i, :3].bool()].tolist()
        got_r = back.batch["responses"][i][back.batch["response_mask"][i].bool()].tolist()
        assert got_p == pr[-3:] and got_r == rs[:4]


def test_multi_turn_response_mask_column(tmp_path):
    dp = verl_batch(seed=6)
    rm = dp.batch["response_mask"].clone()
    rm[:, 1:3] = 0  # tool-output tokens the policy did not generate
    dp.batch["response_mask"] = rm
    schema = pa.schema([pa.field("turn_mask", pa.list_(pa.int8()))])
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=8, snapshot_interval_s=0, schema=schema) as buf:
        keys = buf.push(from_dataproto(dp, response_mask_column="turn_mask"))
        back = to_dataproto(buf.get(keys), max_prompt_length=12, max_response_length=16,
                            response_mask_column="turn_mask")
        assert torch.equal(back.batch["response_mask"], rm)


def test_sample_dataproto_and_sampling_dataset(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=8, snapshot_interval_s=0) as buf:
        for step in range(3):
            buf.push(from_dataproto(verl_batch(seed=step, step=step)))
        dp = sample_dataproto(buf, 8, where="policy_version >= 1", seed=1, max_prompt_length=12, max_response_length=16)
        assert isinstance(dp, DataProto) and len(dp) == 8
        assert set(dp.non_tensor_batch["policy_version"]) <= {1, 2}
        collate = functools.partial(to_dataproto, max_prompt_length=12, max_response_length=16)
        ds = SamplingDataset(buf, n_steps=3, batch_size=4, where="reward > 0.2", collate=collate)
        got = list(ds)
        assert len(got) == 3 and all(isinstance(x, DataProto) and len(x) == 4 for x in got)
        assert all(float(x.batch["token_level_rewards"].sum(-1).min()) > 0.2 for x in got)
        assert_same(ds[1], ds[1])
        # and as a streaming dataset over the whole buffer
        it = RolloutDataset(buf, batch_size=16, shuffle=True, collate=collate, rank=0, world_size=1)
        batches = list(it)
        assert sum(len(b) for b in batches) == 48
