"""The settings base every package's settings inherit, and the serving package's own.

Every process reads its configuration from ``CSTACK_*`` variables through one settings
class per package, each a subclass of :class:`CstackSettings`. A variable is declared once,
in the class that owns it; what several packages read (the Redis URL, the listen host,
the state folder, how long an engine may take to start) is declared here, at the bottom
of the dependency order (tests/test_settings.py holds every name to one declaration).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_VARIANTS_FILE = Path(__file__).with_name("variants.yaml")


class CstackSettings(BaseSettings):
    """What every package reads: declared once, here."""

    model_config = SettingsConfigDict(env_prefix="CSTACK_", extra="ignore")

    #: The Redis (or Valkey) of billing, the gateway's keys and the RL queues. `cstack up`
    #: starts an embedded Valkey unless this is set explicitly.
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: The address servers listen on.
    host: str = "127.0.0.1"
    #: Where `cstack up` and `cstack rl` keep models, logs and the embedded Valkey's data.
    state_dir: Path = Path(".cstack")
    #: How long a command waits for a vLLM engine's /health before giving up.
    vllm_start_timeout_s: float = 900.0

    def redis_url_given(self) -> bool:
        """Whether ``CSTACK_REDIS_URL`` (or the constructor) set the Redis URL."""
        return "redis_url" in self.model_fields_set


class ServingSettings(CstackSettings):
    variants_file: Path = DEFAULT_VARIANTS_FILE
    #: "cpu" or "gpu"; empty means pick from the hardware present.
    serving_profile: str = ""
    #: vLLM's CPU KV cache in GiB; 1 GiB is plenty for the tiny checkpoint.
    vllm_cpu_kvcache_gib: int = 1
    log_dir: Path = Path(".cstack/logs")
    #: The API key vLLM engines require on their OpenAI routes (``/v1/*``): `cstack serve`
    #: starts vLLM with it, and the weight push sends it. vLLM's own variable name
    #: (VLLM_API_KEY) is read too, so one variable serves an engine and its clients.
    #: vLLM checks it on ``/v1/*`` only: its other routes are for the gateway and the
    #: trainer alone, which the network must ensure (README "Security").
    vllm_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("CSTACK_VLLM_API_KEY", "VLLM_API_KEY")
    )
