"""GRPO advantages, the truncated-IS and clipped surrogates, the engine-trainer KL and the
hint KL against hand-computed values."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from training.rl.learner.config import GRPOConfig
from training.rl.learner.grpo_reference import hint_kl_loss, policy_loss
from training.rl.learner.losses import group_advantages, mismatch_kl

CLIP = GRPOConfig(correction="clip", clip_low=0.2, clip_high=0.2)


def test_group_advantages_hand_values() -> None:
    # mean 0.5, sample std sqrt(1/3): (±0.5) / 0.57735 = ±0.866025
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    # mean 1, sample std 1
    adv = group_advantages(torch.tensor([2.0, 0.0, 1.0]), eps=0.0)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0], abs=1e-6)
    assert group_advantages(torch.tensor([2.0, 0.0, 1.0]), scale_by_std=False).tolist() == [
        1.0,
        -1.0,
        0.0,
    ]


def test_equal_rewards_carry_no_signal() -> None:
    assert group_advantages(torch.tensor([1.0, 1.0, 1.0])).abs().max().item() == 0.0


def test_group_needs_two_rewards() -> None:
    with pytest.raises(ValueError, match="at least two"):
        group_advantages(torch.tensor([1.0]))


def _surrogate_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # ratios: row 0 (A=+1): 1.5, 0.5, [pad]; row 1 (A=-1): 1.5, 0.9, 1.0
    sampling = torch.log(torch.tensor([[0.2, 0.4, 0.3], [0.2, 0.5, 0.1]]))
    ratios = torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.9, 1.0]])
    logprobs = (sampling + torch.log(ratios)).requires_grad_(True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return logprobs, sampling, torch.tensor([1.0, -1.0]), mask


def test_clipped_surrogate_token_normalisation() -> None:
    logprobs, sampling, adv, mask = _surrogate_inputs()
    loss, stats = policy_loss(logprobs, sampling, adv, mask, CLIP)
    # per token: -min(1.5,1.2)=-1.2, -min(0.5,0.8)=-0.5 | 1.5, 0.9, 1.0 -> 1.7 / 5
    assert loss.item() == pytest.approx(0.34, abs=1e-6)
    assert stats.tokens == 5
    assert stats.capped_fraction == pytest.approx(1 / 5)
    loss.backward()
    grad = logprobs.grad
    assert grad is not None
    # Clipped token (row 0, ratio 1.5 > 1.2 with A>0) and the padding get no gradient;
    # d(-ratio*A)/dlogp = -ratio*A / 5 elsewhere.
    expected = torch.tensor([[0.0, -0.5 / 5, 0.0], [1.5 / 5, 0.9 / 5, 1.0 / 5]])
    assert torch.allclose(grad, expected, atol=1e-6)


def test_clipped_surrogate_sequence_normalisation() -> None:
    logprobs, sampling, adv, mask = _surrogate_inputs()
    loss, _ = policy_loss(logprobs, sampling, adv, mask, replace(CLIP, normalisation="sequence"))
    # row means: (-1.2 - 0.5) / 2 = -0.85 and (1.5 + 0.9 + 1.0) / 3; then their mean
    assert loss.item() == pytest.approx((-0.85 + 3.4 / 3) / 2, abs=1e-6)


def test_asymmetric_clip() -> None:
    logprobs, sampling, adv, mask = _surrogate_inputs()
    loss, _ = policy_loss(logprobs, sampling, adv, mask, replace(CLIP, clip_high=0.6))
    # row 0 token 0 is no longer clipped (1.5 < 1.6): -1.5 instead of -1.2
    assert loss.item() == pytest.approx(1.4 / 5, abs=1e-6)


def test_truncated_importance_sampling_hand_values() -> None:
    """TIS weights each token's gradient by its ratio, capped at 2 and held constant: no
    token loses its gradient to a clip, and none outweighs the cap."""
    logprobs, sampling, adv, mask = _surrogate_inputs()
    ratios = torch.tensor([[3.0, 0.5, 1.0], [1.5, 0.9, 1.0]])  # row 0 token 0: over the cap
    logprobs = (sampling + torch.log(ratios)).detach().requires_grad_(True)
    config = GRPOConfig(correction="tis", tis_cap=2.0)
    loss, stats = policy_loss(logprobs, sampling, adv, mask, config)
    # per token -w*A: -2.0, -0.5 | 1.5, 0.9, 1.0 -> 0.9 / 5
    assert loss.item() == pytest.approx(0.9 / 5, abs=1e-6)
    assert stats.capped_fraction == pytest.approx(1 / 5)
    loss.backward()
    assert logprobs.grad is not None
    expected = torch.tensor([[-2.0 / 5, -0.5 / 5, 0.0], [1.5 / 5, 0.9 / 5, 1.0 / 5]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)
    # On policy (ratios 1) it is the plain policy gradient, as the clip is.
    on_policy = sampling.clone().requires_grad_(True)
    tis, _ = policy_loss(on_policy, sampling, adv, mask, config)
    clip, _ = policy_loss(on_policy, sampling, adv, mask, CLIP)
    assert tis.item() == pytest.approx(clip.item())


def test_mismatch_kl_is_the_k3_estimate() -> None:
    sampling = torch.log(torch.tensor([0.5, 0.2]))
    trainer = torch.log(torch.tensor([0.25, 0.2]))  # r = 0.5 and 1
    assert mismatch_kl(trainer, sampling).tolist() == pytest.approx([0.5 - 1 - math.log(0.5), 0])


def test_hint_kl_hand_value() -> None:
    # p = [1/4, 3/4], q = [3/4, 1/4]: KL(p||q) = 0.5 ln 3; second token identical -> 0
    student = torch.log(torch.tensor([[[0.25, 0.75], [0.5, 0.5]]])).requires_grad_(True)
    teacher = torch.log(torch.tensor([[[0.75, 0.25], [0.5, 0.5]]]))
    mask = torch.tensor([[True, True]])
    kl_token = hint_kl_loss(student, teacher, mask, "token")
    assert kl_token.item() == pytest.approx(0.5 * math.log(3) / 2, abs=1e-6)
    kl_turn = hint_kl_loss(student, teacher, mask, "turn")
    assert kl_turn.item() == pytest.approx(0.5 * math.log(3), abs=1e-6)
    kl_turn.backward()
    assert student.grad is not None
    # The identical second token sits at the KL minimum: zero gradient.
    assert torch.allclose(student.grad[0, 1], torch.zeros(2), atol=1e-7)


def test_hint_kl_ignores_masked_tokens() -> None:
    student = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    teacher = torch.log(torch.tensor([[[0.75, 0.25], [0.1, 0.9]]]))
    kl = hint_kl_loss(student, teacher, torch.tensor([[True, False]]), "token")
    assert kl.item() == pytest.approx(0.5 * math.log(3), abs=1e-6)
