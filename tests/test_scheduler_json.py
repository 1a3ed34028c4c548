"""The JSON form of a sequence with the scheduler's new fields: round trips, old files, and every
field refused with its name when it is out of range or disagrees with the others."""
import json

import pytest

from repro.errors import BadInput
from repro.scheduler.schema import check_json
from repro.scheduler.sequence import Sequence, random_sequence




def test_json_round_trip_keeps_the_new_fields_and_replays_saved_steps_as_saved():
    seq = random_sequence(7, num_requests=6, spec_tokens=2, data_parallel=True, chunked_prefill=True)
    d = json.loads(json.dumps(seq.to_json()))
    assert d["spec_tokens"] == 2 and d["data_parallel"] is True and "accept" in d["requests"][0]
    assert any(s.get("dummy") for s in d["steps"]) and any(s.get("finished") for s in d["steps"])
    back = Sequence.from_json(d)
    assert back.requests == seq.requests and back.spec_tokens == 2 and back.tail_dummies == seq.tail_dummies
    assert [b.to_json() for b in back.batches()] == d["steps"]  # the explicit steps, as saved
    fresh = Sequence.from_json({**d, "steps": []})
    assert [b.to_json() for b in fresh.batches()] == d["steps"]  # and the scheduler makes them again
    b = next(b for b in back.batches() if not b.dummy)
    assert all(len(row) == 3 for row in b.blocks) and b.draft_lens is not None and b.num_computed is not None


def test_old_json_without_the_new_fields_loads():
    old = {"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 2, "arrive": 0, "preempt_after": None}],
           "num_slots": 4, "max_tokens": 8, "vocab": 512, "seed": 0, "max_steps": None,
           "steps": [{"step": 0, "request_ids": [0], "slots": [1], "query_lens": [3], "has_initial_state": [False],
                      "token_ids": [1, 2, 3], "live_slots": [1]}]}
    seq = Sequence.from_json(old)
    assert seq.spec_tokens == 0 and not seq.data_parallel and seq.requests[0].accept is None
    b = seq.batches()[0]
    assert b.num_computed is None and b.blocks is None and not b.dummy and b.block_rows() == [[1]]
    assert [x.request_ids for x in Sequence.from_json({**old, "steps": []}).batches()] == [[0], [0], [0]]


def _step(**kw):
    s = {"step": 0, "request_ids": [0], "slots": [1], "query_lens": [3], "has_initial_state": [True],
         "token_ids": [1, 2, 3], "num_computed": [4], "prompt_lens": [2], "draft_lens": [2], "num_accepted": [1],
         "blocks": [[1, 2, 3]]}
    s.update(kw)
    return {"num_slots": 4, "max_tokens": 8, "spec_tokens": 2, "steps": [s]}


@pytest.mark.parametrize("doc, needle", [
    (_step(), None),
    ({"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 1, "accept": [1, 4]}], "spec_tokens": 2},
     "accept[1]: 4 is out of range 1..3"),
    ({"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 1, "accept": []}]}, "accept: empty"),
    ({"requests": [{"rid": 0, "prompt_len": 513, "decode_steps": 1}], "max_tokens": 8}, "prompt_len: 513"),
    ({"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 1}], "spec_tokens": 5}, "spec_tokens: 5"),
    ({"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 1}], "spec_tokens": 4, "max_tokens": 4}, "max_tokens 4"),
    ({"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 1}], "data_parallel": 1}, "data_parallel"),
    ({"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 1}], "tail_dummies": 2}, "needs data_parallel"),
    (_step(num_accepted=[4]), "num_accepted[0]: 4"),
    (_step(draft_lens=[1, 2]), "draft_lens: 2 entries"),
    (_step(blocks=[[1, 2]]), "blocks[0]: 2 blocks"),
    (_step(blocks=[[2, 1, 3]]), "slots[0] is 1"),
    (_step(blocks=[[1, 2, 13]]), "blocks[0][2]: 13"),
    (_step(request_ids=[0, 1], slots=[1, 4], query_lens=[1, 1], has_initial_state=[True, True], token_ids=[1, 2],
           num_computed=[4, 4], prompt_lens=[2, 2], draft_lens=[0, 0], num_accepted=[1, 1],
           blocks=[[1, 2, 3], [4, 5, 1]]), "block 1 held by two"),
    (_step(num_computed=[0]), "has_initial_state[0]: true, but num_computed[0] is 0"),
    (_step(draft_lens=[2], query_lens=[2], token_ids=[1, 2]), "draft_lens[0]: 2 drafts in a query of 2"),
    (_step(dummy=True), "requests in a dummy step"),
    (_step(request_ids=[], slots=[], query_lens=[], has_initial_state=[], token_ids=[], num_computed=[],
           prompt_lens=[], draft_lens=[], num_accepted=[], blocks=[]), "dummy step says dummy"),
    (_step(finished=[-1]), "finished[0]: -1"),
])
def test_the_schema_checks_the_new_fields(doc, needle):
    if needle is None:
        check_json(doc)
        return
    with pytest.raises(BadInput, match=needle.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        check_json(doc)


def test_a_dummy_step_loads_and_blocks_must_fit_the_kernels_range():
    dummy = {"step": 0, "request_ids": [], "slots": [], "query_lens": [], "has_initial_state": [], "token_ids": [],
             "dummy": True, "finished": [3]}
    real = _step(blocks=[[1, 4]], slots=[1], draft_lens=[1], query_lens=[2], token_ids=[1, 2])["steps"][0]
    seq = Sequence.from_json({"num_slots": 2, "max_tokens": 8, "spec_tokens": 1, "data_parallel": True,
                              "steps": [dummy, {**real, "step": 1}]})
    b = seq.batches()
    assert b[0].dummy and b[0].finished == [3] and b[0].num_reqs == 0 and b[1].blocks == [[1, 4]]
    seq.check_fits(512, 0)  # blocks 1..2*(1+1)
    with pytest.raises(BadInput, match="blocks: 4 is out of range 0..3"):
        seq.check_fits(512, -1)
