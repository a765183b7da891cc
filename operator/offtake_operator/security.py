"""Security contexts of the pods Offtake renders: restricted by default, overridable, checked.

Every pod passes the Pod Security Standard ``restricted`` (what a namespace labelled
``pod-security.kubernetes.io/enforce=restricted`` admits). A pipeline may override the pod's
and each container's securityContext (``spec.template.spec.securityContext``,
``spec.template.spec.containerSecurityContext``, ``spec.processor.container.securityContext``);
the operator merges the override over the defaults and refuses a result that ``restricted``
would refuse, naming the field, so the mistake shows up as a Degraded condition on the
pipeline instead of a ReplicaSet that silently creates no pods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from offtake.contract import ConfigError

JSON = dict[str, Any]

#: A numeric non-root user: the kubelet can only verify runAsNonRoot for a numeric user, and
#: the image's user (offtake, 10001) must be allowed to read the mounted Secrets.
DEFAULT_UID = 10001

POD_DEFAULTS: JSON = {
    "runAsNonRoot": True,
    "runAsUser": DEFAULT_UID,
    "runAsGroup": DEFAULT_UID,
    "fsGroup": DEFAULT_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}

CONTAINER_DEFAULTS: JSON = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

#: The only capability ``restricted`` lets a container add.
ALLOWED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}
ALLOWED_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}
#: Sysctls the baseline profile (and so restricted) allows.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def merged(defaults: Mapping[str, Any], override: Mapping[str, Any] | None) -> JSON:
    """``override`` over ``defaults``, maps merged key by key (lists and scalars replaced)."""
    out = copy.deepcopy(dict(defaults))
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _seccomp(ctx: Mapping[str, Any], field: str) -> str | None:
    profile = ctx.get("seccompProfile")
    if profile is None:
        return None
    kind = profile.get("type") if isinstance(profile, Mapping) else None
    if kind not in ALLOWED_SECCOMP:
        raise ConfigError(
            f"{field}.seccompProfile.type",
            f"must be RuntimeDefault or Localhost under Pod Security restricted, got {kind!r}",
        )
    return str(kind)


def _common(ctx: Mapping[str, Any], field: str) -> None:
    if ctx.get("runAsNonRoot") is False:
        raise ConfigError(
            f"{field}.runAsNonRoot", "must not be false under Pod Security restricted"
        )
    if ctx.get("runAsUser") == 0:
        raise ConfigError(
            f"{field}.runAsUser", "must not be 0 (root) under Pod Security restricted"
        )
    selinux = ctx.get("seLinuxOptions") or {}
    if isinstance(selinux, Mapping):
        if selinux.get("user") or selinux.get("role"):
            raise ConfigError(
                f"{field}.seLinuxOptions", "must not set user or role under Pod Security restricted"
            )
        if str(selinux.get("type") or "") not in ALLOWED_SELINUX_TYPES:
            raise ConfigError(
                f"{field}.seLinuxOptions.type",
                f"must be one of {sorted(ALLOWED_SELINUX_TYPES)[1:]} under Pod Security restricted",
            )
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        raise ConfigError(f"{field}.windowsOptions.hostProcess", "must not be true")


def check_pod(ctx: Mapping[str, Any], field: str) -> None:
    """Raise ConfigError naming the field if the pod-level context breaks ``restricted``."""
    _common(ctx, field)
    _seccomp(ctx, field)
    for sysctl in ctx.get("sysctls") or []:
        name = sysctl.get("name") if isinstance(sysctl, Mapping) else sysctl
        if name not in SAFE_SYSCTLS:
            raise ConfigError(f"{field}.sysctls", f"{name!r} is not a safe sysctl")


def check_container(ctx: Mapping[str, Any], pod: Mapping[str, Any], field: str) -> None:
    """Raise ConfigError naming the field if a container's context (with the pod's as the
    fallback, as the kubelet resolves it) breaks ``restricted``."""
    _common(ctx, field)
    if ctx.get("privileged"):
        raise ConfigError(f"{field}.privileged", "must not be true under Pod Security restricted")
    if ctx.get("allowPrivilegeEscalation") is not False:
        raise ConfigError(
            f"{field}.allowPrivilegeEscalation", "must be false under Pod Security restricted"
        )
    if ctx.get("procMount") not in (None, "Default"):
        raise ConfigError(f"{field}.procMount", "must be Default under Pod Security restricted")
    caps = ctx.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        raise ConfigError(
            f"{field}.capabilities.drop", "must contain ALL under Pod Security restricted"
        )
    added = set(caps.get("add") or []) - ALLOWED_ADDED_CAPABILITIES
    if added:
        raise ConfigError(
            f"{field}.capabilities.add",
            f"may only add NET_BIND_SERVICE under Pod Security restricted, got {sorted(added)}",
        )
    if ctx.get("runAsNonRoot") is None and pod.get("runAsNonRoot") is not True:
        raise ConfigError(
            f"{field}.runAsNonRoot",
            "must be true (here or on the pod) under Pod Security restricted",
        )
    if _seccomp(ctx, field) is None and _seccomp(pod, field) is None:
        raise ConfigError(
            f"{field}.seccompProfile",
            "must be RuntimeDefault or Localhost (here or on the pod) under Pod Security "
            "restricted",
        )
