"""`cstack serve` against real vLLM: answers, usage, failure causes, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from serving.process import free_port
from tests.support.commands import cstack_command

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]


def _prompt_tokens(model_dir: Path, messages: list[dict[str, str]]) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return len(ids)


def test_chat_completion_usage_matches_tokenizer(vllm_url: str, tiny_model: Path) -> None:
    body = {"model": "composer-2.5", "messages": MESSAGES, "max_tokens": 8}
    reply = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120).json()
    assert reply["object"] == "chat.completion"
    assert reply["usage"]["prompt_tokens"] == _prompt_tokens(tiny_model, MESSAGES)
    assert 1 <= reply["usage"]["completion_tokens"] <= 8


def test_streaming_with_include_usage(vllm_url: str, tiny_model: Path) -> None:
    body = {
        "model": "composer-2.5",
        "messages": MESSAGES,
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = []
    with httpx.stream("POST", f"{vllm_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["prompt_tokens"] == _prompt_tokens(tiny_model, MESSAGES)
    produced = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert usage["completion_tokens"] >= produced >= 1


def test_broken_model_dir_fails_fast_naming_the_cause(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "deepseek_v3", "hidden_size": ')
    started = time.monotonic()
    result = subprocess.run(
        cstack_command("serve", "--model", str(broken), "--port", str(free_port())),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CSTACK_LOG_DIR": str(tmp_path / "logs")},
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "error:" in result.stderr
    assert "JSON" in result.stderr or "config" in result.stderr.lower()
    assert "Traceback" not in result.stderr


def test_not_a_model_dir_is_a_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run(
        cstack_command("serve", "--model", str(tmp_path)), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path} is not a model directory (no config.json)"


def _alive(process: psutil.Process) -> bool:
    """Still running and not a zombie (``is_running`` also tells a reused pid apart)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_engine_worker(process: psutil.Process) -> bool:
    try:
        return process.name().startswith("VLLM::Worker")
    except psutil.NoSuchProcess:  # a short-lived child of the start, gone already
        return False


def test_sigterm_leaves_no_child_behind(tiny_model: Path, tmp_path: Path) -> None:
    serve = subprocess.Popen(
        cstack_command("serve", "--model", str(tiny_model), "--port", str(free_port())),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "CSTACK_LOG_DIR": str(tmp_path / "logs")},
    )
    # Wait until vLLM has started its engine core and worker, so there is a real
    # process tree to clean up; every process of it is recorded, whatever its process
    # group (one that left vLLM's group would outlive a stop that signals only the group).
    tree: list[psutil.Process] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        tree = [c for c in psutil.Process(serve.pid).children(recursive=True) if _alive(c)]
        if any(_is_engine_worker(c) for c in tree):
            break
        time.sleep(0.5)
    assert any(_is_engine_worker(c) for c in tree), "vLLM never started"
    serve.send_signal(signal.SIGTERM)
    serve.wait(timeout=60)
    assert serve.returncode == 128 + signal.SIGTERM
    assert [c.pid for c in tree if _alive(c)] == []
