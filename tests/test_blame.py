"""The blind hunt's last step: which rule of a stack profile is at fault (`repro/search/blame.py`)."""
from repro.knobs.options import ControlRules, FirstChunk, UniformDecode
from repro.knobs.stacks import STACKS
from repro.search.blame import blame, fixed_form


def test_the_rule_whose_fixed_form_clears_the_failure_is_named_with_its_upstream_issue():
    rules = STACKS["vllm-0.33-mrv1"].rules
    b = blame(rules, lambda r: r.uniform_decode is UniformDecode.SHAPE and not r.assert_full_past_prompt)
    assert set(b.rules) == {"uniform_decode", "assert_full_past_prompt"}
    assert "vLLM #53051" in b.upstream and b.hazards == ("shape-only-uniform-decode",)


def test_a_failure_two_rules_make_together_is_found_among_the_pairs():
    rules = STACKS["vllm-0.26"].rules
    b = blame(rules, lambda r: r.first_chunk is FirstChunk.QUERY_LEN or not r.dummy_restages)
    assert set(b.rules) == {"first_chunk", "dummy_restages"} and b.tried > len(b.rules)


def test_a_failure_no_rule_explains_is_a_candidate_upstream_report():
    b = blame(STACKS["vllm-0.26"].rules, lambda r: True)
    assert b.rules == () and "candidate upstream report" in b.line()


def test_the_fixed_stack_has_no_suspect():
    assert blame(ControlRules(), lambda r: True).tried == 0


def test_fixed_form_touches_only_the_named_rules():
    r = fixed_form(STACKS["vllm-0.26"].rules, ["first_chunk"])
    assert r.first_chunk is FirstChunk.IS_PREFILLING and r.uniform_decode is UniformDecode.SHAPE
