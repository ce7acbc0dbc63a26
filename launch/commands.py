"""What each process of a cluster runs, built in one place: the local launcher, the planner's
local actuator and the Ray actors start the same command lines from here.

Pure values in, argv lists out; nothing is started. `pdserve_argv` is how a child runs the
`pdserve` command with this interpreter (so a venv's pdserve runs, whatever PATH says); the
flags are those of `cli/commands/` (`pdserve worker --help`), which Kubernetes runs too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from kv_transfer.transports.base import TransportName
from pdserve.cpu_placement import parse_cores
from pdserve.engine import EngineSettings
from pdserve.redis_auth import has_password
from pdserve.roles import Role, Topology, check_topology

CLI_MODULE = "cli.main"


@dataclass(frozen=True)
class Host:
    """Where one process of a cluster runs: the address it listens on and the others reach it at,
    and the command prefix that runs a command there (`()`: right here). A network namespace is
    `("ip", "netns", "exec", NAME)` (tests/netns.py builds such hosts). The launcher must itself
    reach `address`: it probes the process there and calls it."""

    address: str = "127.0.0.1"
    command_prefix: tuple[str, ...] = ()

    def listen_argv(self, advertise: bool) -> list[str]:
        """The flags that bind a router (`advertise=False`) or a worker (True) to `address`."""
        return ["--host", self.address, *(["--advertise-host", self.address] if advertise else [])]


@dataclass(frozen=True)
class ClusterSpec:
    """One cluster: the engine every worker runs, the pools, and how the processes find each other."""

    engine: EngineSettings
    num_prefill: int = 1
    num_decode: int = 1
    transport: TransportName = "auto"
    cluster: str = "default"
    grpc_port: int = 0
    http_port: int = 0
    cpu_cores: dict[str, str] = field(default_factory=dict)   # role -> cores, e.g. {"prefill": "0", "decode": "1"}
    lease_s: float = 30.0
    kv_pull_timeout_s: float = 30.0
    kv_encryption: str = "auto"          # the workers' --kv-encryption (kv_transfer.encryption)
    ttl_s: float = 3.0
    local_prefill_max_tokens: int = 0
    log_dir: str = ""
    topology: Topology = "disaggregated"
    router_flags: tuple[str, ...] = ()   # more `pdserve router` flags: SLOs, placement and cost files
    router_cores: str | None = None      # None: `router_cores_for` the pools' cores; "": any core

    def __post_init__(self) -> None:
        check_topology(self.topology, self.num_prefill)

    @property
    def router_cpu_cores(self) -> str:
        """The cores the router is bound to ("" = any)."""
        if self.router_cores is not None:
            return self.router_cores
        return router_cores_for(self.cpu_cores, self.num_prefill)

    def router_argv(self, redis_url: str, cluster_secret_file: str = "", redis_password_file: str = "") -> list[str]:
        """`pdserve router` arguments; the two files as `worker_argv` takes them."""
        return ["router", "--model", self.engine.model, "--redis-url", _no_password(redis_url), "--cluster",
                self.cluster, "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
                "--max-model-len", str(self.engine.max_model_len),
                "--local-prefill-max-tokens", str(self.local_prefill_max_tokens), "--topology", self.topology,
                *(["--cpu-cores", self.router_cpu_cores] if self.router_cpu_cores else []),
                *credential_argv(cluster_secret_file, redis_password_file), *self.router_flags]

    def cores_of(self, role: Role, index: int, count: int) -> str:
        """Worker `index` of `count` in a role's pool: its share of the role's cores, split evenly
        when there are at least as many cores as workers (the first workers take any remainder),
        else the role's cores shared; "" when the role is not bound."""
        spec = self.cpu_cores.get(role, "")
        cores = sorted(parse_cores(spec)) if spec else []
        if count <= 1 or len(cores) < count:
            return spec
        size, extra = divmod(len(cores), count)
        start = index * size + min(index, extra)
        return ",".join(str(core) for core in cores[start:start + size + (index < extra)])

    def worker_argv(self, role: Role, worker_id: str, redis_url: str, cpu_cores: str | None = None,
                    cluster_secret_file: str = "", redis_password_file: str = "") -> list[str]:
        """`pdserve worker` arguments; `cpu_cores` overrides the role's cores of the spec."""
        return worker_argv(role=role, worker_id=worker_id, redis_url=redis_url, cluster=self.cluster,
                           transport=self.transport, lease_s=self.lease_s, ttl_s=self.ttl_s, engine=self.engine,
                           kv_pull_timeout_s=self.kv_pull_timeout_s, kv_encryption=self.kv_encryption,
                           cpu_cores=self.cpu_cores.get(role, "") if cpu_cores is None else cpu_cores,
                           cluster_secret_file=cluster_secret_file, redis_password_file=redis_password_file)


def router_cores_for(cpu_cores: dict[str, str], num_prefill: int) -> str:
    """Where the router runs by default: on the prefill workers' cores when the cluster has a prefill
    pool bound to cores the decode workers do not use, else anywhere (""). Every token the router
    relays costs CPU; on a decode worker's core it lengthens that worker's steps (measured on a
    2-core host: steady decode gap 11.5 -> 7.0 ms with the router and client off the decode core,
    BENCHMARKS "Where the unbound processes run"), where a prefill core has room between prompts."""
    prefill, decode = cpu_cores.get("prefill", ""), cpu_cores.get("decode", "")
    if num_prefill < 1 or not prefill:
        return ""
    if decode and parse_cores(prefill) & parse_cores(decode):
        return ""
    return prefill


def worker_argv(*, role: Role, worker_id: str, redis_url: str, cluster: str, transport: str, cpu_cores: str,
                lease_s: float, ttl_s: float, engine: EngineSettings, cluster_secret_file: str = "",
                redis_password_file: str = "", kv_pull_timeout_s: float = 30.0, kv_encryption: str = "auto") -> list[str]:
    """`pdserve worker` arguments; the credentials as `credential_argv` passes them."""
    return ["worker", "--role", role, "--worker-id", worker_id, "--redis-url", _no_password(redis_url),
            "--cluster", cluster, "--transport", transport, "--cpu-cores", cpu_cores, "--lease-s", str(lease_s),
            "--kv-pull-timeout-s", str(kv_pull_timeout_s), "--kv-encryption", kv_encryption, "--ttl-s", str(ttl_s), *credential_argv(cluster_secret_file, redis_password_file),
            *engine_option_argv(engine)]


def credential_argv(cluster_secret_file: str = "", redis_password_file: str = "") -> list[str]:
    """The flags naming the cluster's credential files: paths only, the secrets never go on a
    command line. `cluster_secret_file` authenticates worker gRPC and the KV plane, the password
    file Redis; "" leaves that part unauthenticated (the process warns)."""
    return ([*(["--cluster-secret-file", cluster_secret_file] if cluster_secret_file else []),
             *(["--redis-password-file", redis_password_file] if redis_password_file else [])])


def _no_password(redis_url: str) -> str:
    """`redis_url`, refused if it holds a password: a child's command line is readable by every user."""
    if has_password(redis_url):
        raise ValueError("a Redis URL on a command line must not hold a password: pass the URL without it and "
                         "the password in a file (--redis-password-file)")
    return redis_url


def engine_option_argv(settings: EngineSettings) -> list[str]:
    """The command-line form of `settings`, to start a child process with the same engine."""
    argv = ["--model", settings.model, "--dtype", settings.dtype, "--block-size", str(settings.block_size),
            "--max-model-len", str(settings.max_model_len), "--kv-cache-mb", str(settings.kv_cache_bytes >> 20),
            "--max-num-seqs", str(settings.max_num_seqs), "--seed", str(settings.seed),
            "--vllm-spin-ms", f"{settings.vllm_spin_ms:g}", "--vllm-executor", settings.executor,
            "--vllm-engine-start", settings.engine_start]
    if settings.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(settings.tensor_parallel_size)]
    if settings.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    argv += [] if settings.enable_prefix_caching else ["--no-prefix-caching"]
    return argv + (["--preload", ",".join(settings.preload)] if settings.preload else ["--no-preload"])


def pdserve_argv(args: list[str] | tuple[str, ...]) -> list[str]:
    """`pdserve ARGS` as this interpreter runs it."""
    return [sys.executable, "-m", CLI_MODULE, *args]


def redis_argv(binary: str, host: str, port: int, workdir: str, protected: bool = True, config_file: str = "") -> list[str]:
    """redis-server as the registry needs it: no persistence, in the foreground. `config_file`: a
    0600 file holding `requirepass` (`redis_config_text`), so the password is never on the command
    line. `protected=False` lets other nodes connect without a password: never needed with one."""
    argv = [binary, *([config_file] if config_file else []), "--port", str(port), "--bind", host, "--save", "",
            "--appendonly", "no", "--dir", workdir, "--daemonize", "no", "--loglevel", "warning"]
    return argv + ([] if protected else ["--protected-mode", "no"])


def redis_config_text(password: str) -> str:
    """The redis.conf lines that make clients authenticate with `password` (AUTH, or a URL with it)."""
    if not password or any(not 0x21 <= ord(c) <= 0x7e or c in "\"'\\" for c in password):
        raise ValueError("a Redis password for a redis-server pdserve starts is printable ASCII without spaces, "
                         "quotes or backslashes (pdserve generates 64 hex digits)")
    return f"requirepass {password}\n"
