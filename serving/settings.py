"""Settings for the serving package (env prefix ``CSTACK_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_VARIANTS_FILE = Path(__file__).with_name("variants.yaml")


class ServingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CSTACK_", extra="ignore")

    variants_file: Path = DEFAULT_VARIANTS_FILE
    #: "cpu" or "gpu"; empty means pick from the hardware present.
    serving_profile: str = ""
    #: vLLM's CPU KV cache in GiB; 1 GiB is plenty for the tiny checkpoint.
    vllm_cpu_kvcache_gib: int = 1
    #: How long `cstack serve` waits for /health before giving up.
    vllm_start_timeout_s: float = 600.0
    log_dir: Path = Path(".cstack/logs")
    #: The API key vLLM engines require on their OpenAI routes (``/v1/*``): `cstack serve`
    #: starts vLLM with it, and the weight push sends it. vLLM's own variable name
    #: (VLLM_API_KEY) is read too, so one variable serves an engine and its clients.
    #: vLLM checks it on ``/v1/*`` only: its other routes are for the gateway and the
    #: trainer alone, which the network must ensure (README "Security").
    vllm_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("CSTACK_VLLM_API_KEY", "VLLM_API_KEY")
    )
