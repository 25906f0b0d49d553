"""Run vLLM's OpenAI server as a managed child process."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from serving.process import ManagedProcess

#: Lines of vLLM's log that begin a phase of its start, and what to call each phase. vLLM
#: starts three processes one after the other (API server, engine, model worker), each
#: importing vLLM and torch first: about 10 s each on 2 cores. The CPU build's own lines
#: are the warm-up's and the compile cache's; a GPU's, model loading and CUDA graphs.
START_PHASES: tuple[tuple[str, str], ...] = (
    ("non-default args:", "starting the engine process"),
    ("Initializing a V1 LLM engine", "starting the model worker"),
    ("Starting to load model", "loading weights"),
    ("Warming up model for the compilation", "compiling CPU kernels"),
    ("Directly load AOT compilation", "loading compiled kernels from the cache"),
    ("Warming up done", "allocating the KV cache"),
    ("Model loading took", "profiling memory and compiling"),
    ("Capturing CUDA graphs", "capturing CUDA graphs"),
    ("init engine (profile, create kv cache, warmup model) took", "starting the API server"),
    ("Application startup complete", "answering /health"),
)


class VllmServer(ManagedProcess):
    def __init__(
        self,
        model_dir: Path,
        port: int,
        engine_args: Sequence[str] = (),
        served_model_name: str = "composer-2.5",
        host: str = "127.0.0.1",
        log_path: Path = Path(".cstack/logs/vllm.log"),
        env: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        """``api_key``: what vLLM then requires on ``/v1/*`` as ``Authorization: Bearer``."""
        self.model_dir = Path(model_dir)
        self.host = host
        self.port = port
        # `vllm serve` fails with the CPU build (it looks up metadata named `vllm`).
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", served_model_name,
            "--host", host,
            "--port", str(port),
            *engine_args,
        ]  # fmt: skip
        env = dict(env or {})
        if api_key:
            # vLLM's own variable rather than --api-key: a command line is visible to
            # every user of the machine (ps), an environment only to the process owner.
            env["VLLM_API_KEY"] = api_key
        # /health is not behind the key (vLLM guards /v1/* only), so it needs none.
        super().__init__("vLLM", command, log_path, f"{self.base_url}/health", env)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def phase_of(self, line: str) -> str | None:
        for marker, phase in START_PHASES:
            if marker in line:
                return phase
        return None
