"""What LpMirrorDescent keeps for checkpoints and pickles of earlier versions (``mdlib.optim.mirror_descent``: ``__setstate__``, ``load_state_dict``): a
checkpoint or pickle made to look like an earlier version's loads, gets what it lacks, loses what is no
longer kept, and steps as this version's does, bit for bit. (The param-group options a checkpoint lacks:
test_optim_conventions.py and test_torch_conformance.py's ``test_can_load_older_state_dict``.)"""

import copy
import pickle

import torch

from mdlib.optim.mirror_descent import _ATTRIBUTE_DEFAULTS, _DROPPED_STATE, _GROUP_DEFAULTS
from mdlib.optim import LpMirrorDescent
from tiny_model import loss_of, make_model  # tests/tiny_model.py (pytest puts tests/ on the path)


def train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, k).backward()
        opt.step()
    opt.check()


def assert_same_parameters(a, b):
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


def test_per_parameter_entries_of_earlier_versions_are_dropped_on_loading():
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=1.5)
    train(model, opt, 2)
    current = copy.deepcopy(opt.state_dict())
    older = copy.deepcopy(current)
    for entry in older["state"].values():
        entry.update(version=torch.tensor(7), exact=torch.tensor(True))
    assert set(_DROPPED_STATE) == {"version", "exact"}
    resumed = []
    for checkpoint in (current, older):
        again = make_model(seed=3)
        again.load_state_dict(model.state_dict())
        again_opt = LpMirrorDescent(again.parameters(), lr=0.05, p=1.5)
        again_opt.load_state_dict(checkpoint)
        assert [set(state) for state in again_opt.state.values()] == [{"dual"}] * 4
        train(again, again_opt, 2, start=2)
        resumed.append(again)
    assert_same_parameters(*resumed)


def test_a_pickle_of_an_earlier_version_gets_the_attributes_and_options_it_lacks(monkeypatch):
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=1.5)
    train(model, opt, 2)
    this_version = LpMirrorDescent.__getstate__

    def earlier_version(self):
        state = this_version(self)
        for key in _ATTRIBUTE_DEFAULTS:
            del state[key]
        state["param_groups"] = [{k: v for k, v in group.items() if k not in _GROUP_DEFAULTS}
                                 for group in state["param_groups"]]
        return state

    monkeypatch.setattr(LpMirrorDescent, "__getstate__", earlier_version)
    older = pickle.dumps((model, opt))
    monkeypatch.undo()
    older_model, older_opt = pickle.loads(older)
    assert {key: getattr(older_opt, key) for key in _ATTRIBUTE_DEFAULTS} == {"lazy_check": None, "check_edits": True}
    assert {key: older_opt.param_groups[0][key] for key in _GROUP_DEFAULTS} == _GROUP_DEFAULTS
    current_model, current_opt = pickle.loads(pickle.dumps((model, opt)))
    train(older_model, older_opt, 2, start=2)
    train(current_model, current_opt, 2, start=2)
    assert_same_parameters(older_model, current_model)
