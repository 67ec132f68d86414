"""The one learning-rate schedule (pipeline/pretrain/schedule.py): each consumer's convention gives,
bit for bit, the rates its own formula gives (the formulas below are the consumers' own, written
out: pre-training by updates and by wall clock, fine-tuning's LambdaLR multiplier, skip-gram)."""

from __future__ import annotations

import pytest
import torch

from pipeline.pretrain.schedule import (
    Budget,
    budget_steps,
    linear_warmup_decay,
    lr_at_progress,
    lr_at_step,
    warmup_steps_for,
)

PEAKS = (1e-3, 3e-3, 5e-5, 2e-4, 1.0)


def pretrain_step_formula(step, peak, warmup_steps, total_steps):
    ramp = (step + 1) / warmup_steps if warmup_steps > 0 else 1.0
    decay = (total_steps - step) / max(total_steps - warmup_steps, 1)
    return peak * max(0.0, min(1.0, ramp, decay))


def pretrain_progress_formula(progress, peak, warmup_fraction):
    ramp = progress / warmup_fraction if warmup_fraction > 0 else 1.0
    decay = (1.0 - progress) / max(1.0 - warmup_fraction, 1e-9)
    return peak * max(0.0, min(1.0, ramp, decay))


def finetune_multiplier_formula(step, warmup_steps, total_steps):
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def same(a: float, b: float) -> bool:
    return a == b and type(a) is type(b) and str(a) == str(b)  # the same float, sign of zero included


@pytest.mark.parametrize("total", [1, 2, 3, 7, 10, 97, 1000, 8000])
def test_pretraining_by_updates_is_its_formula_bit_for_bit(total):
    for warmup in sorted({0, 1, 2, total // 10, warmup_steps_for(0.06, total), total - 1, total, total + 5}):
        for peak in PEAKS:
            for step in range(total + 3):
                old = pretrain_step_formula(step, peak, warmup, total)
                assert same(lr_at_step(step, peak=peak, warmup_steps=warmup, total_steps=total), old), (
                    total,
                    warmup,
                    peak,
                    step,
                )


def test_pretraining_by_wall_clock_is_its_formula_bit_for_bit():
    progresses = [i / 997 for i in range(998)] + [0.1 + 1e-12, 0.06, 1.0, 0.5]
    for fraction in (0.0, 0.06, 0.1, 0.5, 0.999, 1 - 1e-10):
        for peak in PEAKS:
            for p in progresses:
                new = lr_at_progress(p, peak=peak, warmup_fraction=fraction)
                assert same(new, pretrain_progress_formula(p, peak, fraction)), (fraction, peak, p)


@pytest.mark.parametrize("planned", [1, 3, 10, 37, 110, 1000])
def test_fine_tuning_is_googles_ramp_bit_for_bit_also_through_lambdalr(planned):
    for ratio in (0.0, 0.06, 0.1, 0.5, 0.99):
        warmup = int(round(ratio * planned))
        for step in range(planned + 3):
            new = linear_warmup_decay(step, warmup=warmup, total=planned, ramp_offset=0)
            assert same(new, finetune_multiplier_formula(step, warmup, planned)), (planned, warmup, step)
        rates = {}
        for name, fn in (
            ("old", lambda s, w=warmup: finetune_multiplier_formula(s, w, planned)),
            ("new", lambda s, w=warmup: linear_warmup_decay(s, warmup=w, total=planned, ramp_offset=0)),
        ):
            opt = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": lr} for lr in (2e-5, 3e-5 * 0.95**3)])
            sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
            seen = []
            for _ in range(planned + 1):
                seen.append([g["lr"] for g in opt.param_groups])
                opt.step()
                sched.step()
            rates[name] = seen
        assert rates["new"] == rates["old"]


def test_skipgram_decay_is_its_formula_bit_for_bit():
    for total in (1, 3, 7, 100, 4097):
        for lr in (1e-2, 3e-3, 0.025):
            for step in range(total):
                new = lr_at_progress(step / total, peak=lr, warmup_fraction=0.0)
                assert same(new, lr * (1 - step / total)), (total, lr, step)


def test_the_conventions_differ_only_in_the_ramp():
    # pre-training: the first update moves and the peak is at update warmup - 1; Google's: 0, then peak at warmup
    assert [linear_warmup_decay(t, warmup=4, total=12, ramp_offset=1) for t in range(5)] == [0.25, 0.5, 0.75, 1, 1]
    assert [linear_warmup_decay(t, warmup=4, total=12, ramp_offset=0) for t in range(5)] == [0, 0.25, 0.5, 0.75, 1]
    for offset in (0, 1):  # the decay is the same: halfway at 8, 0 at the end and after it
        assert [linear_warmup_decay(t, warmup=4, total=12, ramp_offset=offset) for t in (8, 12, 20)] == [0.5, 0, 0]


def test_budget_steps_and_the_budget():
    per_epoch = {0: 10, 1: 9, 2: 11}.get
    assert budget_steps(max_steps=7, epochs=None, grad_accum=2, batches_per_epoch=per_epoch) == 7
    assert budget_steps(max_steps=None, epochs=1.5, grad_accum=2, batches_per_epoch=per_epoch) == (10 + 4) // 2
    assert budget_steps(max_steps=None, epochs=None, grad_accum=1, batches_per_epoch=per_epoch) is None
    with pytest.raises(Exception, match=r"pretrain.epochs = 0.1 is less than one update; raise it"):
        budget_steps(max_steps=None, epochs=0.1, grad_accum=4, batches_per_epoch=per_epoch)
    steps = Budget("max_steps", 20, peak=1e-3, warmup=0.1, total_steps=20)
    assert steps.warmup_steps == 2 and steps.seconds is None and steps.deterministic
    assert steps.lr(0, 0.0) == lr_at_step(0, peak=1e-3, warmup_steps=2, total_steps=20)
    assert not steps.finished(19, 1e9) and steps.finished(20, 0.0)
    clock = Budget("time_minutes", 0.5, peak=1e-3, warmup=0.1, total_steps=None, extends=[{"max_steps": 4}])
    assert clock.seconds == 30.0 and not clock.deterministic and clock.finished(0, 30.0)
    assert clock.lr(99, 15.0) == lr_at_progress(0.5, peak=1e-3, warmup_fraction=0.1)
    assert clock.record() == {
        "kind": "time_minutes",
        "value": 0.5,
        "steps": None,
        "deterministic": False,
        "extends": [{"max_steps": 4}],
    }
