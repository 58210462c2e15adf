"""The constraint table (``sampling.constraint``): bit-packed masks, the step, the free state."""

import numpy as np
import pytest

from decodelab.sampling.constraint import FREE, ConstraintTable


def digits_then_end(V=70, eos=69):
    """Two states past the free one over V ids: state 1 takes one of ids 0..9 (-> 2); state 2
    accepts and takes EOS or another digit (-> 2)."""
    allowed = np.zeros((3, V), bool)
    nxt = np.zeros((3, V), np.int32)
    allowed[FREE] = True
    allowed[1, :10] = allowed[2, :10] = True
    nxt[1, :10] = nxt[2, :10] = 2
    allowed[2, eos] = True
    return allowed, nxt, np.array([True, False, True])


def test_the_packed_mask_and_the_step_read_back_the_dense_table():
    allowed, nxt, accepting = digits_then_end()
    table = ConstraintTable.from_dense(allowed, nxt, accepting)
    assert table.num_states == 4 and table.allowed.shape == (4, 3)  # ceil(70 / 32) words
    states = np.array([0, 1, 2, 3])  # 3: a padding state, allows nothing
    mask = np.asarray(table.allowed_mask(states))
    np.testing.assert_array_equal(mask[:3], allowed)
    assert not mask[3].any()
    stepped = table.advance(np.array([0, 1, 2]), np.array([7, 3, 9]))
    np.testing.assert_array_equal(np.asarray(stepped), [0, 2, 2])
    logits = np.zeros((4, 70), np.float32)
    masked = np.asarray(table.mask_logits(logits, states))
    assert np.isneginf(masked[1, 10:]).all() and (masked[1, :10] == 0).all()
    np.testing.assert_array_equal(np.asarray(table.accepting[:3]), accepting)


def test_the_free_table_allows_everything_and_the_states_are_bucketed():
    table = ConstraintTable.free(33, min_states=5)
    assert table.num_states == 8 and table.allowed.shape == (8, 2)
    assert np.asarray(table.allowed_mask(np.array([FREE]))).all()
    with pytest.raises(ValueError, match="state 0 of a constraint table must be the free state"):
        ConstraintTable.from_dense(np.zeros((1, 4), bool), np.zeros((1, 4)), np.ones(1, bool))
