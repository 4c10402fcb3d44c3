"""The public routes and RPCs in groups, Triton's way, each with the key it needs (`--restricted_api`, `--open_api`).

    group             REST                                            gRPC
    health            /health /ready /v2/health/* /v2/models/.../ready grpc.health.v1; KServe ServerLive,
                                                                        ServerReady, ModelReady
    metadata          GET /v2, /v2/models/<m>[/versions/<v>],         KServe ServerMetadata, ModelMetadata
                      /v1/models[/<m>], /info
    metrics           /metrics                                        KServe ModelStatistics
    model-repository  /v2/repository/...                             KServe Repository*
    admin             /docs, /openapi.json, /redoc; /ready's details  -
    inference         everything else (predict, infer, generate...)   MSService; KServe ModelInfer...

Which key a group needs: its own when restricted (`--restricted_api model-repository,admin=KEY`); none when opened
(`--open_api metrics`) or, for health, unless restricted (probes carry no credentials); otherwise the server's
`--api_key`, if any. /ready's details (worker keys and pids) go to a caller with the admin group's key; with no
key for it, to a caller on this host (loopback), unless the group is opened.
"""

import re
from collections.abc import Iterable, Mapping

from mindspore_serving.common import errors
from mindspore_serving.frontends.auth import ApiKey, is_loopback
from mindspore_serving.frontends.health import is_probe

HEALTH, METADATA, METRICS, REPOSITORY, ADMIN, INFERENCE = (
    "health",
    "metadata",
    "metrics",
    "model-repository",
    "admin",
    "inference",
)
GROUPS = (HEALTH, METADATA, METRICS, REPOSITORY, ADMIN, INFERENCE)

_ADMIN_PATHS = frozenset(("/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"))
_METADATA_GET = re.compile(r"/v2/?|/v2/models/[^/]+(/versions/[^/]+)?/?|/v1/models(/[^/]+)?|/info")
_KSERVE = "/inference.GRPCInferenceService/"
_RPC_GROUPS = {
    **{_KSERVE + name: HEALTH for name in ("ServerLive", "ServerReady", "ModelReady")},
    **{_KSERVE + name: METADATA for name in ("ServerMetadata", "ModelMetadata", "ModelConfig")},
    _KSERVE + "ModelStatistics": METRICS,
    **{_KSERVE + name: REPOSITORY for name in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")},
}


def http_group(method: str, path: str) -> str:
    """The group of a REST request."""
    if is_probe(path):
        return HEALTH
    if path == "/metrics":
        return METRICS
    if path.startswith("/v2/repository/"):
        return REPOSITORY
    if path in _ADMIN_PATHS:
        return ADMIN
    if method in ("GET", "HEAD") and _METADATA_GET.fullmatch(path):
        return METADATA
    return INFERENCE


def grpc_group(rpc: str) -> str:
    """The group of an RPC, by its full method name (`/package.Service/Method`)."""
    if rpc.startswith("/grpc.health.v1.Health/"):
        return HEALTH
    return _RPC_GROUPS.get(rpc, INFERENCE)


def check_groups(groups: Iterable[str], what: str) -> tuple:
    """The group names, each known; RuntimeError naming the bad one."""
    groups = tuple(groups)
    for group in groups:
        if group not in GROUPS:
            raise RuntimeError(f"{what}: unknown API group {group!r}; the groups are {', '.join(GROUPS)}")
    return groups


class Access:
    """The key each group needs (None: open), from the server's key, the restricted groups' keys and the groups
    opened explicitly."""

    def __init__(
        self, api_key: str | None = None, restricted: Mapping[str, str] | None = None, opened: Iterable[str] = ()
    ):
        restricted = dict(restricted or {})
        self.opened = frozenset(check_groups(opened, "open_api"))
        check_groups(restricted, "restricted_api")
        both = self.opened & set(restricted)
        if both:
            raise RuntimeError(f"API group(s) {', '.join(sorted(both))} cannot be both restricted and open")
        main = ApiKey(api_key) if api_key else None
        self.keys = {
            group: (
                ApiKey(restricted[group])
                if group in restricted
                else None
                if group in self.opened or group == HEALTH
                else main
            )
            for group in GROUPS
        }

    @property
    def guarded(self) -> bool:
        """Whether any group needs a key."""
        return any(key is not None for key in self.keys.values())

    def check_http(self, method: str, path: str, headers) -> errors.Unauthenticated | None:
        key = self.keys[http_group(method, path)]
        return None if key is None else key.check_http(headers)

    def check_grpc(self, rpc: str, metadata) -> errors.Unauthenticated | None:
        key = self.keys[grpc_group(rpc)]
        return None if key is None else key.check_grpc(metadata)

    def is_operator(self, scope) -> bool:
        """Whether an HTTP request (its ASGI scope) may see internals (/ready's worker keys and pids)."""
        key = self.keys[ADMIN]
        if key is not None:
            return key.check_http(scope.get("headers", ())) is None
        return ADMIN in self.opened or is_loopback((scope.get("client") or ("",))[0])
