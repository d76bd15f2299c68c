"""Resuming on a different number of ranks (`nmt.train.resume.reshard`)."""

from __future__ import annotations

import dataclasses

from nmt.train.resume import reshard
from nmt.train.update import TrainState


def test_same_rank_count_changes_nothing():
    state = TrainState(step=40, epoch=2, batch_in_epoch=7)
    assert reshard(state, 2, 2) is None
    assert (state.epoch, state.batch_in_epoch) == (2, 7)


def test_a_new_rank_count_mid_epoch_restarts_the_data_at_the_next_epoch():
    state = TrainState(step=40, epoch=2, batch_in_epoch=7, tokens=1234, best_bleu=12.5)
    before = dataclasses.replace(state)
    note = reshard(state, 1, 4)
    assert note == "resuming on 4 ranks (saved with 1): data restarts at the next epoch"
    assert (state.epoch, state.batch_in_epoch) == (3, 0)
    # only the data position moves: the update count, tokens and best score are kept
    assert (state.step, state.tokens, state.best_bleu) == (before.step, before.tokens, before.best_bleu)


def test_a_new_rank_count_at_an_epoch_boundary_needs_no_reshard():
    state = TrainState(step=40, epoch=3, batch_in_epoch=0)
    assert reshard(state, 4, 2) is None
    assert (state.epoch, state.batch_in_epoch) == (3, 0)
