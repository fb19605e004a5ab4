"""ringattn.log_to: the library's log lines as records of Python's logging."""
import logging

import numpy as np
import pytest

import ringattn


@pytest.fixture
def records():
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record)

    logger = logging.getLogger("ringattn.test")
    logger.setLevel(logging.DEBUG)
    handler = Keep()
    logger.addHandler(handler)
    ringattn.log_to(logger, logging.INFO)
    yield got
    ringattn.log_to(None)
    logger.removeHandler(handler)


def test_a_plans_lines_and_a_refusal_reach_the_logger(records):
    plan = ringattn.Plan([0, 64], 2, 16, causal=True)
    lines = [r for r in records if r.subsystem == "plan"]
    assert any(r.getMessage().startswith("plan: 1 seqs, 64 queries") for r in lines), lines
    assert all(r.levelno == logging.INFO and r.rank == 0 and r.ranks == 1 for r in lines)
    with pytest.raises(ringattn.InvalidArgumentError) as refused:
        ringattn.Plan([0, 64], 3, 16, num_kv_heads=2)  # 2 does not divide 3
    last = records[-1]
    assert last.subsystem == "plan" and last.levelno == logging.INFO
    assert last.getMessage() == refused.value.message + " (invalid argument)"
    del plan


def test_log_to_none_stops_the_records(records):
    ringattn.log_to(None)
    before = len(records)
    ringattn.Plan([0, 8], 1, 8)
    assert len(records) == before
