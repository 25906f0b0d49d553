"""The `toolchoice` environment's warm-up: teach the tiny random model to read a hint.

Targeted text feedback can only help if the policy, shown the hint, knows better than
without it (the hinted policy is the teacher). A random-initialised model does not read
its context, so before RL this script fine-tunes the seed-0 tiny checkpoint with plain
next-token cross-entropy on prompts rendered exactly as vLLM renders them:

* with a hint message (``--hinted-share`` of the examples) -> one of the tools the hint
  lists, uniformly. ``--hints task``: the hint is the one the RL trigger inserts for the
  example's task (so hint reading is learnt for these four hints only); ``--hints random``:
  any four tools (general hint reading);
* without the hint (the rest) -> one of all eight tool names, uniformly.

It never shows an un-hinted prompt with the task's own tools: that is what RL must learn.
At the end it prints the share of tool-token mass on the task's tools with and without
the hint (averaged over the four tasks).

    OMP_NUM_THREADS=1 .venv/bin/python bench/rl_toolchoice.py --out .cstack/toolchoice-warm \
        --steps 300 --lr 1e-3 --hints task --hinted-share 1.0
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import torch

from serving.tiny import build_tiny_checkpoint
from training.models.deepseek_v3.model import DeepseekV3Model
from training.rl.feedback import Encode, TextFeedbackConfig, hinted_prompt, load_feedback_config
from training.rl.rollouts.environments import (
    TOOLCHOICE_TOOLS,
    toolchoice_available,
    toolchoice_hint,
    toolchoice_prompt,
)


def _encoder(model_dir: Path) -> Encode:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False).ids)


def render_user(encode: Encode, content: str) -> list[int]:
    """The chat template's rendering of one user message plus the generation prompt."""
    return encode(f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n")


def warm_up(
    base: Path,
    out: Path,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    hinted_share: float,
    task_hints: bool,
) -> dict[str, float]:
    encode = _encoder(base)
    feedback = load_feedback_config()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = DeepseekV3Model.from_pretrained(base).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    eos = encode("<|im_end|>")
    tool_ids = {name: encode(name) for name in TOOLCHOICE_TOOLS}
    assert all(len(ids) == 1 for ids in tool_ids.values()), tool_ids

    def example() -> tuple[list[int], list[int]]:
        task = f"tools-{rng.randrange(4)}"
        prompt = render_user(encode, toolchoice_prompt(task))
        if rng.random() >= hinted_share:
            return prompt, tool_ids[rng.choice(TOOLCHOICE_TOOLS)] + eos
        listed = toolchoice_available(task) if task_hints else rng.sample(TOOLCHOICE_TOOLS, 4)
        hinted = hinted_prompt(prompt, toolchoice_hint(listed, feedback), feedback, encode)
        return hinted, tool_ids[rng.choice(listed)] + eos

    for step in range(steps):
        rows = [example() for _ in range(batch)]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.zeros(batch, width, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p) - 1 : len(p) + len(c) - 1] = torch.tensor(c)
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            shares = measure(model, encode, feedback)
            model.train()
            print(f"warm-up step {step}: loss {loss.item():.3f} {shares}", flush=True)
    stats = measure(model, encode, feedback)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"):  # fmt: skip
        if (base / name).exists():
            shutil.copy2(base / name, out / name)
    return stats


@torch.no_grad()
def measure(
    model: DeepseekV3Model, encode: Encode, feedback: TextFeedbackConfig
) -> dict[str, float]:
    """Probability mass on the listed tools, with and without the hint, per RL task."""
    model.eval()
    tool_ids = torch.tensor([encode(n)[0] for n in TOOLCHOICE_TOOLS])
    hinted_mass: list[float] = []
    plain_mass: list[float] = []
    tool_mass: list[float] = []
    for k in range(4):
        task = f"tools-{k}"
        available = toolchoice_available(task)
        mask = torch.tensor([n in available for n in TOOLCHOICE_TOOLS])
        prompt = render_user(encode, toolchoice_prompt(task))
        hinted = hinted_prompt(prompt, toolchoice_hint(available, feedback), feedback, encode)
        for ids, sink in ((prompt, plain_mass), (hinted, hinted_mass)):
            probs = torch.softmax(model(torch.tensor([ids]))[0, -1].float(), -1)[tool_ids]
            sink.append(float(probs[mask].sum() / probs.sum()))
            if sink is plain_mass:
                tool_mass.append(float(probs.sum()))
    return {
        "valid_share_without_hint": sum(plain_mass) / 4,
        "valid_share_with_hint": sum(hinted_mass) / 4,
        "tool_token_mass_without_hint": sum(tool_mass) / 4,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".cstack/toolchoice-warm"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hinted-share", type=float, default=0.5)
    parser.add_argument(
        "--hints", choices=("task", "random"), default="task",
        help="task: hints list the RL tasks' own tool sets; random: any four tools.",
    )  # fmt: skip
    args = parser.parse_args()
    base = build_tiny_checkpoint(args.out.parent / "tiny-seed0", seed=0)
    stats = warm_up(
        base,
        args.out,
        args.steps,
        args.batch,
        args.lr,
        args.seed,
        args.hinted_share,
        args.hints == "task",
    )
    for key, value in stats.items():
        print(f"{key}: {value:.3f}")
    print(f"warm checkpoint in {args.out}")


if __name__ == "__main__":
    main()
